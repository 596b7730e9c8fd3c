"""charlm.data.globs: a quoted glob matches what `glob.glob(recursive=True)` matches in a tree
without links, and never follows a symlink to a folder."""

import glob
import os

import pytest

from charlm.data.globs import expand_glob

FILES = ["src/m.py", "src/pkg/n.py", "src/pkg/deep/o.py", "src/readme.md", "src/.hidden/h.py",
         ".git/x.py", "top.py", "src/pkg/dn.txt", "src/a.py", "lib/pkg/d.py"]


@pytest.mark.parametrize("pattern", [
    "**/*.py", "src/**/*.py", "src/*/*.py", "src/?.py", "*/pkg/[dn]*.py", ".git/*", "*.py",
    "src/**/deep/*", "**/.hidden/*.py", "src/*/", "**/pkg/*.py"])
def test_a_glob_matches_what_glob_glob_matches_without_links(tmp_path, monkeypatch, pattern):
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    monkeypatch.chdir(tmp_path)
    expected = sorted(m.rstrip("/") for m in glob.glob(pattern, recursive=True))
    assert [m for m, _ in expand_glob(pattern)[1]] == expected
    absolute = f"{tmp_path}/{pattern}"
    assert [m for m, _ in expand_glob(absolute)[1]] == [f"{tmp_path}/{m}" for m in expected]


def test_double_star_does_not_follow_a_link_to_a_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("hi\n")
    os.symlink("..", tmp_path / "sub" / "up")
    os.symlink(".", tmp_path / "sub" / "self")
    assert expand_glob(f"{tmp_path}/**/*.txt") == (
        str(tmp_path), [(f"{tmp_path}/sub/a.txt", False)])
