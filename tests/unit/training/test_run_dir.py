"""charlm.training.run_dir: the run lock."""

import os

import pytest

from charlm.training import run_dir as rundir


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
