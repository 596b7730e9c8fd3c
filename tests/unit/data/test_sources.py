"""What `list_sources` makes of files, folders, globs and patterns, and the errors for what it
cannot use.

charlm.data.sources: a quoted glob matches what `glob.glob(recursive=True)` matches in a tree
without links, and never follows a symlink to a folder.

The sha256 of a source's chunks hashed on a second thread (`HashingReader`): the same digest as
hashlib's, in order, with no more than one chunk waiting, and a worker that stops with the
`with`."""



import glob
import hashlib
import io
import os
import threading

import pytest

from charlm.core.errors import CharlmError
from charlm.data import sources
from charlm.data.sources import HashingReader, expand_glob, list_sources


def tree(root, files):
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    return root


def listed(specs, **kw):
    return [(s.name, s.key) for s in list_sources([str(p) for p in specs], **kw)]


def test_a_folder_is_walked_sorted_by_path_without_hidden_names(tmp_path):
    root = tree(tmp_path / "notes", ["b.txt", "a/z.txt", "a.txt", ".hidden", ".git/config",
                                     "a/.cache/x.txt", "c/d/e.md"])
    assert [key for _, key in listed([root])] == ["a.txt", "a/z.txt", "b.txt", "c/d/e.md"]
    assert listed([root])[1] == (str(root / "a" / "z.txt"), "a/z.txt")


def test_a_glob_is_expanded_by_charlm_with_double_star_for_any_depth(tmp_path, monkeypatch):
    tree(tmp_path, ["src/m.py", "src/pkg/n.py", "src/pkg/deep/o.py", "src/readme.md"])
    monkeypatch.chdir(tmp_path)
    assert listed(["src/**/*.py"]) == [("src/m.py", "m.py"), ("src/pkg/deep/o.py", "pkg/deep/o.py"),
                                       ("src/pkg/n.py", "pkg/n.py")]
    with pytest.raises(CharlmError) as e:
        listed(["src/**/*.rs"])
    assert str(e.value) == ("no file matches src/**/*.rs; check the pattern (charlm expands it: "
                            "quote it, and use ** for any depth)")


def test_several_inputs_keep_their_order_and_name_each_file_once(tmp_path):
    root = tree(tmp_path / "d", ["a.txt", "b.txt"])
    one = tree(tmp_path, ["one.txt"]) / "one.txt"
    assert [n for n, _ in listed([one, root, root / "a.txt"])] == [
        str(one), str(root / "a.txt"), str(root / "b.txt")]


def test_include_and_exclude_filter_the_files_of_folders_not_a_named_file(tmp_path):
    root = tree(tmp_path / "code", ["m.py", "tests/t.py", "tests/data.txt", "notes.md"])
    assert [k for _, k in listed([root], include=["*.py"])] == ["m.py", "tests/t.py"]
    assert [k for _, k in listed([root], include=["*.py"], exclude=["tests/*"])] == ["m.py"]
    named = root / "notes.md"
    assert [k for _, k in listed([named], include=["*.py"])] == ["notes.md"]
    with pytest.raises(CharlmError) as e:
        listed([root], include=["*.rs"])
    assert str(e.value) == (f"none of the 4 files of {root} passes --include / --exclude; give "
                            "a folder or pattern with text files in it")


def test_an_empty_folder_a_symlink_loop_and_a_missing_file_are_one_error_each(tmp_path):
    (tmp_path / "empty").mkdir()
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    for spec, message in (
        (tmp_path / "empty", f"{tmp_path / 'empty'} holds no files; give a folder or pattern "
                             "with text files in it"),
        (loop, f"input {loop} is a symlink loop (too many levels of symbolic links); fix the "
               "link"),
        (tmp_path / "none.txt", f"input file not found: {tmp_path / 'none.txt'}"),
    ):
        with pytest.raises(CharlmError) as e:
            listed([spec])
        assert str(e.value) == message


def test_a_quoted_glob_ends_on_symlink_loops_and_a_linked_file_is_read_once(tmp_path):
    """`charlm prepare '/tmp/qa-g/**/*.txt'` with `sub/up -> ..` read sub/a.txt 41 times, and
    with a second loop never ended while its memory grew."""
    root = tree(tmp_path / "g", ["sub/a.txt"])
    os.symlink("..", root / "sub" / "up")
    assert listed([f"{root}/**/*.txt"]) == [(f"{root}/sub/a.txt", "sub/a.txt")]
    os.symlink(".", root / "sub" / "self")
    assert listed([f"{root}/**/*.txt"]) == [(f"{root}/sub/a.txt", "sub/a.txt")]
    os.symlink("a.txt", root / "sub" / "b.txt")  # the same file by two names: read once
    assert listed([root, f"{root}/sub/a.txt"]) == [(str(root / "sub" / "a.txt"), "sub/a.txt")]


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


def test_chunks_hash_in_their_order_to_hashlibs_digest():
    chunks = [bytes([i]) * (1000 + 37 * i) for i in range(50)] + [b"", b"tail"]
    with HashingReader(io.BytesIO(), None) as digest:
        for chunk in chunks:
            digest.update(chunk)
        assert digest.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()
    with HashingReader(io.BytesIO(), None) as empty:
        assert empty.hexdigest() == hashlib.sha256().hexdigest()


def test_a_slow_hash_holds_no_more_than_one_chunk(monkeypatch):
    """A reader faster than the hash waits at its next `update`, so the chunks held for the
    worker never pile up (a 200 MB file would otherwise sit in memory)."""
    started, release, waiting = threading.Event(), threading.Event(), []
    real_sha256 = hashlib.sha256

    class Slow:
        def __init__(self):
            self.real = real_sha256()

        def update(self, chunk):
            started.set()
            release.wait(5)
            self.real.update(chunk)

        def hexdigest(self):
            return self.real.hexdigest()

    monkeypatch.setattr(sources.hashlib, "sha256", Slow)
    with HashingReader(io.BytesIO(), None) as digest:
        digest.update(b"first")
        assert started.wait(5)
        blocked = threading.Thread(target=lambda: (digest.update(b"second"), waiting.append(1)))
        blocked.start()
        blocked.join(0.2)
        assert blocked.is_alive() and not waiting  # "second" waits for "first"
        release.set()
        blocked.join(5)
        assert waiting == [1]
        assert digest.hexdigest() == real_sha256(b"firstsecond").hexdigest()


def test_the_worker_stops_with_the_block_and_its_error_reaches_the_reader(monkeypatch):
    with HashingReader(io.BytesIO(), None) as digest:
        digest.update(b"x")
    assert not [t for t in threading.enumerate() if t.name.startswith("charlm-sha256")]

    class Broken:
        def update(self, chunk):
            raise OSError("hash failed")

    monkeypatch.setattr(sources.hashlib, "sha256", Broken)
    with HashingReader(io.BytesIO(), None) as digest, pytest.raises(OSError, match="hash failed"):
        digest.update(b"x")
        digest.hexdigest()
