"""charlm.tune.trial: the Follower of a trial's metrics.jsonl, the parent-death SIGTERM of its
`charlm train`, the stop signals of a study, a trial's seeded runs, whether it saved, and whether
its run dir is in use."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from charlm.config.loading import load_config
from charlm.tune.trial import Follower, Stop, in_use, repeated, saved, stop_signals
from tests.helpers import TINY, write


def test_follower_reads_each_line_once_and_again_after_a_cut_back(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    follower = Follower(path)
    assert follower.events() == []
    write(path, '{"step": 1}\n{"step": 2}\n{"st')
    assert follower.events() == [{"step": 1}, {"step": 2}]
    with open(path, "a") as f:
        f.write('ep": 3}\n')
    assert follower.events() == [{"step": 3}]
    write(path, '{"step": 1}\n')  # a resumed run cut its log back
    assert follower.events() == [{"step": 1}]


def test_a_trials_parent_death_sigterm_is_one_request_however_often_it_comes(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture) -> None:
    """A trial's `charlm train` (parent-death signal SIGTERM, `die_with`) gets a SIGTERM for
    each thread of its tuner that takes it on as a `kill -9` ends the tuner: the second aborted
    the save that the first had announced (train.log said "saving last.pt", and there was
    none). There SIGTERM only asks to stop, in the handler and in the watcher past its grace;
    a SIGINT after it still aborts."""
    from charlm.training import faults

    monkeypatch.setattr(faults, "parent_death_signal", lambda: signal.SIGTERM)
    monkeypatch.setattr(faults, "ABORT_GRACE_S", 0.1)  # the watcher's wait for the handler
    with faults.StopSignals(saved=True) as stop:
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.4)  # past the grace: a watcher that counted them would have ended pytest
        assert stop.signum == signal.SIGTERM
        monkeypatch.setattr(faults, "ABORT_GRACE_S", 10.0)
        with pytest.raises(faults.Aborted):
            os.kill(os.getpid(), signal.SIGINT)
    assert capfd.readouterr().err == (
        "\nSIGTERM: finishing this step and saving last.pt (press Ctrl-C again to abort without "
        "saving)\naborted: last.pt holds the last completed save\n")


def test_a_first_signal_asks_the_trials_to_stop_and_a_second_aborts_them(capfd) -> None:
    stop = Stop(threading.Event(), threading.Event())
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with stop_signals(stop):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested.is_set() and not stop.aborted.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.aborted.is_set()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert capfd.readouterr().err == (
        "\nSIGTERM: each running trial saves last.pt and stops (press Ctrl-C again to abort "
        "them)\naborting the running trials without saving\n")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_stop_records_the_first_signal(signum: int, capfd) -> None:
    stop = Stop(threading.Event(), threading.Event())
    with stop_signals(stop):
        os.kill(os.getpid(), signum)
        os.kill(os.getpid(), signal.SIGINT if signum == signal.SIGTERM else signal.SIGTERM)
    assert stop.signum == signum
    capfd.readouterr()


def test_a_repeated_trial_runs_each_seed_in_its_own_dir(tmp_path: Path) -> None:
    cfg = load_config(TINY, [f"train.out_dir={tmp_path / 'trial-0003'}", "train.seed=7"])
    assert repeated(cfg, 1) == [cfg]
    runs = repeated(cfg, 3)
    assert [(r.train.seed, r.train.out_dir) for r in runs] == [
        (seed, str(tmp_path / "trial-0003" / f"seed-{seed}")) for seed in (7, 8, 9)]
    assert cfg.train.seed == 7 and cfg.train.out_dir == str(tmp_path / "trial-0003")
    assert all(r.model == cfg.model and r.optim == cfg.optim for r in runs)


def test_a_trial_has_saved_when_it_or_one_of_its_seeds_has_a_last_pt(tmp_path: Path) -> None:
    assert not saved(tmp_path)
    (tmp_path / "seed-8").mkdir()
    (tmp_path / "seed-8" / "best.pt").write_bytes(b"x")
    assert not saved(tmp_path)
    (tmp_path / "seed-8" / "last.pt").write_bytes(b"x")
    assert saved(tmp_path)


def test_a_run_dir_is_in_use_while_a_run_holds_its_lock_or_a_seeds(tmp_path: Path) -> None:
    from charlm.training.run_dir import run_lock

    trial = tmp_path / "trial-0002"
    assert not in_use(trial)  # not made yet
    (trial / "seed-8").mkdir(parents=True)
    for run in (trial, trial / "seed-8"):
        (run / "last.pt").write_bytes(b"x")  # run_lock removes only the dirs it made empty
        with run_lock(run):
            assert in_use(trial)
        assert not in_use(trial)
