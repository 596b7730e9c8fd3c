"""charlm.tune.trial: the Follower of a trial's metrics.jsonl, the parent-death SIGTERM of its
`charlm train`, and the stop signals of a study."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from charlm.tune.trial import Follower, Stop, stop_signals
from tests.helpers import write


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
