"""charlm.tune.runner: values reported at the tokens seen, no prune at the final eval, a
worker's error that stops the study, a killed tuner's trial that still trains, and one GPU per
worker."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch

from charlm.config.loading import load_config
from charlm.core.errors import CharlmError
from charlm.tune.space import read_search
from tests.helpers import TINY, write

pytest.importorskip("optuna")  # Tuner runs on Optuna, an optional extra


@pytest.mark.parametrize("spec, expected", [
    ("optim.lr=[0.002, 0.01]", {20: 3.0, 40: 2.5, 60: 2.4}),  # at the step
    # a batch of 32 sees the base config's (16) tokens of 40 steps in 20, of 80 in 40, ...
    ("train.batch_size=[8, 32]", {40: 3.0, 80: 2.5, 120: 2.4}),
])
def test_values_are_reported_at_tokens_seen_when_a_step_changes_size(
        tmp_path: Path, spec: str, expected: dict[int, float]) -> None:
    from charlm.tune.runner import Tuner
    from charlm.tune.study import StudyConfig

    base = load_config(TINY).to_dict()  # batch 16 x block 16, an eval every 20 steps
    tuner = Tuner(StudyConfig(tmp_path, base, read_search([spec]), None, "s", "data"), 1, 5, None)
    trial = tuner.study.ask()
    report = tuner.reporter(trial)
    for step, value in ((20, 3.0), (40, 2.5), (60, 2.4)):
        assert not report({"event": "eval", "step": step, "tokens": step * 32 * 16,
                           "best_val_loss": value})
    assert tuner.study.get_trials()[0].intermediate_values == expected


def test_a_trial_is_not_pruned_at_its_final_eval(tmp_path: Path) -> None:
    """Worse than the median of two complete trials: pruned at step 40, not at step 60, its
    train.max_iters (it has trained to its end, and completes)."""
    from charlm.tune.runner import Tuner
    from charlm.tune.study import StudyConfig

    base = load_config(TINY, ["train.max_iters=60"]).to_dict()
    search = read_search(["optim.lr=[0.002, 0.01]", "startup_trials=2", "pruner_warmup=0"])
    tuner = Tuner(StudyConfig(tmp_path, base, search, None, "s", "data"), 1, 5, None)
    for _ in range(2):
        done = tuner.study.ask()
        for step in (20, 40, 60):
            done.report(2.0, step)
        tuner.study.tell(done, 2.0)
    trial = tuner.study.ask()
    report = tuner.reporter(trial, last_step=60)
    assert [report({"event": "eval", "step": s, "best_val_loss": 3.0}) for s in (20, 40, 60)] == [
        True, True, False]
    assert tuner.study.get_trials()[2].intermediate_values == {20: 3.0, 40: 3.0, 60: 3.0}


def test_an_error_in_a_worker_stops_the_study_with_one_line(tmp_path: Path) -> None:
    from charlm.tune.runner import Tuner
    from charlm.tune.study import StudyConfig

    base = load_config(TINY).to_dict()
    tuner = Tuner(StudyConfig(tmp_path, base, read_search(["optim.lr=[0.002, 0.01]"]), None, "s",
                       "data"), 2, 5, None)

    def lost(trial, slot: int) -> None:
        raise RuntimeError("server closed the connection unexpectedly\nmore detail")

    tuner.run_one = lost
    with pytest.raises(CharlmError) as e:
        tuner.run()
    assert str(e.value) == (
        "the study stopped: RuntimeError: server closed the connection unexpectedly; its trials "
        f"so far are saved: continue with `charlm tune --out {tmp_path} --resume` once the cause "
        "is fixed")


def test_a_killed_tuners_trial_that_still_trains_is_waited_for_then_resumed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    """Its `charlm train` holds the run dir's lock: --resume waits for it to end (on Linux it
    got a SIGTERM when its tuner died and is saving last.pt) instead of failing it, or training
    it a second time beside it; then it resumes from that run's own last save."""
    from charlm.training.run_dir import run_lock
    from charlm.tune import runner
    from charlm.tune.runner import Tuner
    from charlm.tune.study import StudyConfig

    tuner = Tuner(StudyConfig(tmp_path, load_config(TINY).to_dict(),
                       read_search(["optim.lr=[0.002, 0.01]"]), None, "s", "data"), 1, 5, None)
    run_dir = tmp_path / "trial-0000"
    run_dir.mkdir()
    (run_dir / "last.pt").write_bytes(b"saved")
    trial = tuner.study.ask()
    for name, value in (("worker", f"{tuner.host}:4242"), ("host", tuner.host),
                        ("run_dir", str(run_dir))):
        trial.set_user_attr(name, value)
    monkeypatch.setattr(runner, "alive", lambda pid: False)  # its tuner was killed
    recovering = threading.Thread(target=tuner.recover)
    with run_lock(run_dir):  # the orphaned `charlm train`, still saving
        recovering.start()
        time.sleep(1.0)
        assert recovering.is_alive()
        assert [t.state.name for t in tuner.study.get_trials()] == ["RUNNING"]
    recovering.join(5)
    assert not recovering.is_alive()
    first, again = tuner.study.get_trials()
    assert (first.state.name, first.user_attrs["interrupted"]) == ("FAIL", True)
    assert (again.state.name, again.user_attrs) == (
        "WAITING", {"resume_of": 0, "run_dir": str(run_dir)})
    assert capfd.readouterr().err == (
        f"waiting for trial 0's `charlm train`, left by a killed tuner, to end in {run_dir} "
        "(Ctrl-C stops waiting)\n")


def test_a_resumed_trial_whose_run_ended_on_its_own_takes_its_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed tuner's `charlm train` trained to its end alone (no parent-death signal off
    Linux, or the signal came at its last step): the trial completes with that run's final
    value; nothing is trained again (a resume of a finished run has nothing to train)."""
    from charlm.tune import runner
    from charlm.tune.runner import Tuner
    from charlm.tune.study import StudyConfig

    tuner = Tuner(StudyConfig(tmp_path, load_config(TINY, ["train.max_iters=60"]).to_dict(),
                       read_search(["optim.lr=[0.002, 0.01]"]), None, "s", "data"), 1, 5, None)
    run_dir = tmp_path / "trial-0000"
    run_dir.mkdir()
    write(run_dir / "metrics.jsonl", "".join(
        json.dumps(e) + "\n" for s, v in ((20, 3.0), (40, 2.5), (60, 2.4))
        for e in ({"event": "eval", "step": s, "best_val_loss": v}, {"event": "train", "step": s})))
    tuner.study.enqueue_trial({"optim.lr": 0.01}, user_attrs={"run_dir": str(run_dir)})

    def trained(*args) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(runner, "run_trial", trained)
    tuner.run_one(tuner.study.ask(), 0)
    (trial,) = tuner.study.get_trials()
    assert (trial.state.name, trial.value, trial.user_attrs["step"]) == ("COMPLETE", 2.4, 60)


def test_each_worker_gets_a_gpu_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from charlm.tune.runner import cuda_slots

    base = load_config(TINY, ["train.device=cuda"]).to_dict()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_slots(base, 2) == []  # no GPU: the trials share the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert cuda_slots(base, 1) == []  # one worker: its trial takes the device as configured
    assert cuda_slots(base, 2) == ["0", "1"]
    assert cuda_slots(load_config(TINY, ["train.device=cpu"]).to_dict(), 2) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert cuda_slots(base, 2) == ["4", "6"]
    with pytest.raises(CharlmError) as e:
        cuda_slots(base, 3)
    assert str(e.value) == ("--workers 3 runs one trial per GPU, and this machine has 2; give "
                            "--workers 2 or fewer")
