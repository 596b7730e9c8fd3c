"""charlm.core.files: atomic writes reach the disk before they replace a file, and name the target
when they fail."""

import errno
import os

import pytest

from charlm.config.loading import save_config
from charlm.config.schema import RunConfig
from charlm.core.files import write_text_atomic
from charlm.training import checkpoint


def test_a_failed_atomic_write_names_the_target_and_keeps_it(tmp_path, monkeypatch):
    """A full disk while writing config.yaml said `error: No space left on device:
    RUN/.config.yaml.tmp-PID`, a file the user never sees; it names config.yaml now."""
    path = tmp_path / "config.yaml"
    path.write_text("old\n", encoding="utf-8")

    def disk_full(fd):  # the written data does not fit on the disk
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError) as e:
        write_text_atomic(path, "new\n")
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(path))
    monkeypatch.undo()
    assert path.read_text(encoding="utf-8") == "old\n"
    assert os.listdir(tmp_path) == ["config.yaml"]


def test_run_files_reach_the_disk_before_they_replace_the_old_ones(tmp_path, monkeypatch):
    """config.yaml (and meta.json, metrics.jsonl on resume, export JSON) was moved into place
    without an fsync, unlike checkpoints: after a power loss the new name could hold an
    empty or partial file."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(
        ("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))) or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(
        ("replace", os.path.basename(a), os.path.basename(b))) or real_replace(a, b))
    save_config(RunConfig(), tmp_path / "config.yaml")
    checkpoint.save({"step": 1}, tmp_path / "last.pt")
    tmp = f"-{os.getpid()}"
    assert events == [("fsync", f".config.yaml.tmp{tmp}"),
                      ("replace", f".config.yaml.tmp{tmp}", "config.yaml"),
                      ("fsync", f".last.pt.tmp{tmp}"), ("replace", f".last.pt.tmp{tmp}", "last.pt")]
    assert sorted(os.listdir(tmp_path)) == ["config.yaml", "last.pt"]
