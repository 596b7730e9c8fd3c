"""charlm.training.run_dir: the run lock, which dirs a fresh run may use, and what --overwrite
removes."""

import os

import pytest

from charlm.core.errors import CharlmError
from charlm.training import checkpoint
from charlm.training import run_dir as rundir
from tests.helpers import files_under


def test_run_lock_holds_the_run_dir_that_is_there(tmp_path, monkeypatch):
    """A run that fails early removes the empty run dir it made. Another run that opened that
    dir just before must not lock the removed directory and go on unlocked beside a third: it
    takes the lock on the directory at the path, made again."""
    import fcntl

    run = tmp_path / "runs" / "x"
    real_flock = fcntl.flock
    calls = []

    def flock_after_a_removal(fd, op):
        if not calls:  # between this run's open and its lock, another run removed the dir
            run.rmdir()
            run.mkdir()
        calls.append(fd)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_removal)
    with rundir.run_lock(run):
        monkeypatch.setattr(fcntl, "flock", real_flock)
        other = os.open(run, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert len(calls) == 2
    assert run.is_dir()  # made again by the other run: not this one's to remove


def _user_folder(folder):
    """The issue's folder: the user's own config.yaml (for charlm even, but not a run's), their
    notes in tb/, their text."""
    (folder / "tb").mkdir(parents=True)
    (folder / "tb" / "notes").write_text("my notes\n")
    (folder / "config.yaml").write_text("model:\n  n_layer: 1  # mine\n")
    (folder / "my.txt").write_text("hello\n")
    return files_under(folder)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_fresh_run_among_files_that_are_no_run_is_refused(tmp_path, overwrite):
    """`charlm train my.txt --out .` in a folder with the user's own config.yaml and tb/notes
    said it "already holds a run" and --overwrite then replaced config.yaml and deleted
    tb/notes. A folder is a run only with a charlm checkpoint or a run's complete config.yaml;
    one that holds none is refused, with --overwrite too, and nothing in it changes."""
    before = _user_folder(tmp_path)
    with pytest.raises(CharlmError) as e:
        rundir.check_run_dir(tmp_path, resume=False, overwrite=overwrite)
    assert str(e.value) == (f"{tmp_path} is not empty and holds no charlm run (config.yaml, "
                            "my.txt, tb); give a new or empty directory as --out, or a run dir "
                            "to replace")
    assert files_under(tmp_path) == before


def test_a_new_an_empty_or_a_dataset_only_dir_may_take_a_fresh_run(tmp_path):
    """A dir that holds only what a run makes before its first step (the dataset cache of
    `charlm train TEXT` killed while preparing, tune's trial.yaml, a killed save's temporary)."""
    rundir.check_run_dir(tmp_path / "new", resume=False, overwrite=False)
    (tmp_path / "run" / "dataset").mkdir(parents=True)
    (tmp_path / "run" / "trial.yaml").touch()
    (tmp_path / "run" / ".last.pt.tmp-99").touch()
    rundir.check_run_dir(tmp_path / "run", resume=False, overwrite=False)


def _run_folder(folder):
    """A run (its complete config.yaml and a checkpoint) beside the user's own files."""
    from charlm.config.loading import save_config
    from charlm.config.schema import RunConfig

    before = _user_folder(folder)
    (folder / "config.yaml").unlink()
    save_config(RunConfig(), folder / "config.yaml")
    checkpoint.save({"format": checkpoint.FORMAT, "version": checkpoint.VERSION},
                    folder / "last.pt")
    (folder / "tb" / "events.out.tfevents.1.host.2.0").write_bytes(b"events")
    (folder / "metrics.jsonl").write_text("{}\n")
    (folder / "dataset").mkdir()
    (folder / "dataset" / "meta.json").write_text("{}")
    return {p: b for p, b in before.items() if p != "config.yaml"}


def test_overwrite_removes_only_the_files_a_run_writes(tmp_path):
    """--overwrite deleted all of tb/ (the user's notes too); now only a run's own files go:
    checkpoints, metrics.jsonl, config.yaml and TensorBoard's event files."""
    kept = _run_folder(tmp_path)
    with pytest.raises(CharlmError, match="already holds a run .*continue it with --resume"):
        rundir.check_run_dir(tmp_path, resume=False, overwrite=False)
    rundir.check_run_dir(tmp_path, resume=False, overwrite=True)
    rundir.clear_run(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "dataset", "dataset/meta.json", "my.txt", "tb", "tb/notes"]
    assert {p: (tmp_path / p).read_bytes() for p in kept} == kept


def test_overwrite_refuses_a_file_of_a_runs_name_that_charlm_did_not_write(tmp_path):
    """Another tool's best.pt (a torch file too) beside a run is not the run's to remove."""
    import torch

    _run_folder(tmp_path)
    torch.save({"model": {}}, tmp_path / "best.pt")
    before = files_under(tmp_path)
    with pytest.raises(CharlmError) as e:
        rundir.check_run_dir(tmp_path, resume=False, overwrite=True)
    assert str(e.value) == (f"{tmp_path / 'best.pt'} is not what charlm writes there, and "
                            "--overwrite removes only a run's own files; move it out of the way, "
                            "or choose another --out")
    assert files_under(tmp_path) == before


def test_overwrite_removes_the_step_checkpoints_and_keeps_the_users_files_there(tmp_path):
    """train.keep_checkpoints' checkpoints/step-NNNNNN.pt are a run's own files, and what a
    killed save of one left; a user's file in checkpoints/ (and the folder with it) stays."""
    _run_folder(tmp_path)
    steps = tmp_path / "checkpoints"
    steps.mkdir()
    for name in ("step-000500.pt", "step-1000000.pt", ".step-000600.pt.tmp-99999"):
        (steps / name).write_bytes(b"ckpt")
    rundir.check_run_dir(tmp_path, resume=False, overwrite=True)
    rundir.clear_run(tmp_path)
    assert not steps.exists()
    steps.mkdir()
    for name in ("step-000500.pt", "notes.txt", "step-500.pt"):
        (steps / name).write_bytes(b"mine")
    rundir.clear_run(tmp_path)
    assert sorted(p.name for p in steps.iterdir()) == ["notes.txt", "step-500.pt"]
