"""charlm.core.files: atomic writes reach the disk before they replace a file, and name the target
when they fail; whole-file reads refuse what is not a regular file, or too large."""

import errno
import os

import pytest

from charlm.config.loading import save_config
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.core.files import read_capped, read_regular, write_text_atomic
from charlm.training import checkpoint
from tests.helpers import endless_stdin, raised_reading_fifo


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


NOT_REGULAR = "not a regular file (a directory, FIFO or device); give a regular file"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_read_regular_refuses_a_fifo_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "vocab.json"
    os.mkfifo(fifo)
    e = raised_reading_fifo(fifo, lambda: read_regular(fifo, "export file", 1 << 20))
    assert isinstance(e, CharlmError)
    assert str(e) == f"cannot read export file {fifo}: {NOT_REGULAR}"


def test_read_regular_refuses_a_device_behind_a_symlink_and_a_directory(tmp_path):
    zero = tmp_path / "zero.pt"
    zero.symlink_to("/dev/zero")
    for path in (zero, tmp_path):
        with pytest.raises(CharlmError) as e:
            read_regular(path, "checkpoint", 1 << 20)
        assert str(e.value) == f"cannot read checkpoint {path}: {NOT_REGULAR}"


def test_read_regular_refuses_a_file_over_its_limit_and_names_the_limit(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:  # sparse: nothing is written
        f.truncate((1 << 20) + 1)
    with pytest.raises(CharlmError) as e:
        read_regular(big, "config file", 1 << 20)
    assert str(e.value) == (f"cannot read config file {big}: it holds more than 1 MiB, charlm's "
                            "limit for it; give a smaller one")
    assert read_regular(big, "config file", 2 << 20) == bytes((1 << 20) + 1)


def test_read_capped_stops_an_endless_stream_just_past_its_limit():
    stdin = endless_stdin(limit=4 << 20)
    with pytest.raises(CharlmError) as e:
        read_capped(stdin.buffer, 1 << 20, "the prompt on stdin")
    assert str(e.value) == ("cannot read the prompt on stdin: it holds more than 1 MiB, "
                            "charlm's limit for it; give a smaller one")


def test_strangers_are_the_names_charlm_did_not_write(tmp_path):
    """What `--overwrite` and a fresh run must leave alone: anything but the given names and
    the `.NAME.TAG-PID` temporaries of those names."""
    from charlm.core.files import strangers

    for name in ("config.yaml", ".config.yaml.tmp-12", ".last.pt.old-3", "notes.txt",
                 ".config.yaml.tmp-x", "config.yaml.tmp-1", ".git", ".write-test-1-2"):
        (tmp_path / name).touch()
    assert strangers(tmp_path, ("config.yaml",)) == [
        ".config.yaml.tmp-x", ".git", ".last.pt.old-3", "config.yaml.tmp-1", "notes.txt"]


def test_remove_temps_only_dead_removes_a_dead_exports_directory_too(tmp_path):
    """A killed export leaves `.OUT.tmp-PID/` (as big as the export): the next export removes
    it, and its own PID's (a dead process's it reuses), but not a running process's."""
    from charlm.core.files import remove_temps

    out = tmp_path / "out"
    dead, running = 4_194_305, os.getppid()  # above Linux's largest pid_max; pytest's parent
    for pid in (dead, os.getpid(), running):
        (tmp_path / f".out.tmp-{pid}").mkdir()
        (tmp_path / f".out.tmp-{pid}" / "model.safetensors").write_bytes(b"x" * 10)
    remove_temps(out, only_dead=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".out.tmp-{running}"]


def test_missing_names_what_stands_in_the_way(tmp_path):
    """`Path.exists()` is False for a symlink loop and a dangling link too, which were both
    reported as "not found"."""
    from charlm.core.files import missing

    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    (tmp_path / "dangling").symlink_to("nowhere")
    assert [str(missing(tmp_path / name, "input file")) for name in ("a", "dangling", "none")] == [
        f"cannot read input file {tmp_path / 'a'}: a symlink loop (too many levels of symbolic "
        "links); fix or remove the link",
        f"cannot read input file {tmp_path / 'dangling'}: a symlink to nowhere, which does not "
        "exist; fix or remove the link",
        f"input file not found: {tmp_path / 'none'}"]
    assert str(missing(tmp_path / "none", "run", "no run here")) == "no run here"
