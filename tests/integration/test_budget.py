"""The time budget of a run: a budgeted run's fixed schedule, across a resume and an interrupt."""

import json
import math
import signal
from pathlib import Path

import pytest
import yaml

from charlm.core.errors import CharlmError
from charlm.training import budget
from charlm.training import loop as train_module
from charlm.training.checkpoint import load
from charlm.training.faults import Interrupted
from charlm.training.loop import lr_at, train
from charlm.training.run_dir import resume_config
from tests.helpers import assert_same_weights, files_under, signal_after_steps, with_


@pytest.fixture
def quick_timer(monkeypatch):
    """Steps timed for no minimum time: the plan is made after step 4 (1 + 3 timed)."""
    monkeypatch.setattr(budget, "TIMING_MAX_S", 0.0)


def fixed_plan(monkeypatch, more: int) -> list:
    """The plan gives `more` steps after the timed ones; returns the plan's calls."""
    calls = []

    def plan(*args):
        calls.append(args)
        return more

    monkeypatch.setattr(train_module, "plan_steps", plan)
    return calls


def events(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def test_a_budget_fixes_the_steps_and_lays_the_schedule_over_them(tiny_cfg, quick_timer,
                                                                   monkeypatch):
    calls = fixed_plan(monkeypatch, 7)
    cfg = with_(tiny_cfg, train={"max_time": 600.0, "eval_interval": 5,
                                 "checkpoint_interval": 2})
    state = train(cfg)
    run = Path(cfg.train.out_dir)
    assert state.step == 11 and state.budget_steps == 11
    remaining, step_s, eval_s, save_s, every_eval, every_save = calls[0]
    assert (every_eval, every_save) == (5, 2) and 0 < remaining < 600
    assert min(step_s, eval_s, save_s) > 0
    assert [e["step"] for e in events(run, "eval")] == [4, 5, 10, 11]  # 4: the timed steps
    last = load(run / "last.pt")
    assert last["train_state"]["budget_steps"] == 11 and last["config"]["train"]["max_iters"] == 11
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert (saved["max_iters"], saved["max_time"]) == (11, 600.0)
    optim = cfg.optim
    # Before the plan, past warmup (5 steps), the rate is the peak; after it, the cosine over 11.
    lrs = {e["step"]: e["lr"] for e in events(run, "eval")}
    assert lrs[4] == lr_at(3, optim, math.inf) == pytest.approx(optim.lr * 4 / 6)
    assert lrs[11] == lr_at(10, optim, 11)
    assert lrs[10] == lr_at(9, optim, 11) > lrs[11]


def test_a_resumed_budget_continues_the_same_schedule(tiny_cfg, tmp_path, quick_timer,
                                                      monkeypatch):
    fixed_plan(monkeypatch, 12)
    base = with_(tiny_cfg, train={"max_time": 600.0, "eval_interval": 5})
    train(with_(base, train={"out_dir": str(tmp_path / "straight")}))
    run = tmp_path / "split"
    signal_after_steps(monkeypatch, {9: [signal.SIGTERM]})
    with pytest.raises(Interrupted):
        train(with_(base, train={"out_dir": str(run)}))
    assert load(run / "last.pt")["train_state"]["step"] == 9
    monkeypatch.undo()
    calls = fixed_plan(monkeypatch, 1000)  # a resumed budget does not plan again
    state = train(resume_config(run, None, []), resume=True)
    assert calls == [] and state.step == 16
    assert_same_weights(tmp_path / "straight" / "last.pt", run / "last.pt")


def test_a_run_interrupted_before_its_plan_times_again(tiny_cfg, quick_timer, monkeypatch):
    fixed_plan(monkeypatch, 3)
    cfg = with_(tiny_cfg, train={"max_time": 600.0})
    signal_after_steps(monkeypatch, {2: [signal.SIGINT]})
    with pytest.raises(Interrupted):
        train(cfg)
    run = Path(cfg.train.out_dir)
    assert "budget_steps" not in load(run / "last.pt")["train_state"]  # a run without one
    monkeypatch.undo()
    monkeypatch.setattr(budget, "TIMING_MAX_S", 0.0)
    fixed_plan(monkeypatch, 3)
    state = train(resume_config(run, None, []), resume=True)
    assert state.step == 2 + 4 + 3 and state.budget_steps == 9  # timed from step 3 on resume


def test_a_budget_too_short_for_an_evaluation_is_one_error(tiny_cfg, quick_timer):
    cfg = with_(tiny_cfg, train={"max_time": 0.01})
    with pytest.raises(CharlmError) as e:
        train(cfg)
    message = str(e.value)
    assert message.startswith("train.max_time=0.0s is too short for this run here: ")
    assert "which leaves no time for the final evaluation; give at least " in message
    assert message.endswith("(or set train.max_iters without a budget)")


def test_a_finished_budget_refuses_what_it_cannot_apply_and_trains_on_without_it(
        cli, tiny_cfg, quick_timer, monkeypatch):
    """A finished --time run resumed with --set train.max_iters=2000 or --time 30s said "done"
    with exit 0, trained nothing, and config.yaml then recorded a budget never applied. Each is
    one error now, every file as it was; dropping the budget trains on to max_iters."""
    fixed_plan(monkeypatch, 3)
    cfg = with_(tiny_cfg, train={"max_time": 600.0, "eval_interval": 100, "eval_iters": 1,
                                 "sample_chars": 0})
    train(cfg)
    run = Path(cfg.train.out_dir)
    before = files_under(run)
    how = "--set train.max_time=null --set train.max_iters=N"
    for args, message in [
        (["--set", "train.max_iters=2000"],
         "--resume: train.max_iters=2000 cannot apply: the run's time budget "
         f"train.max_time=10m00s fixed its steps at 7, its schedule laid over them; to train to "
         f"another step, resume with {how}"),
        (["--time", "30s"],
         "--resume: train.max_time=30.0s cannot apply: the run's time budget train.max_time=10m00s "
         f"fixed its steps at 7, its schedule laid over them; to train to another step, resume "
         f"with {how}"),
        ([], f"--resume: nothing to train: {run / 'last.pt'} is at step 7 and train.max_iters "
             "is 7, where its time budget train.max_time=10m00s ended; to train on, resume with "
             f"{how} (N above 7)"),
    ]:
        result = cli("train", "--out", run, "--resume", *args)
        assert (result.code, result.err) == (2, f"error: {message}\n")
        assert files_under(run) == before
    longer = cli("train", "--out", run, "--resume", "--set", "train.max_time=null",
                 "--set", "train.max_iters=9")
    assert longer.code == 0 and "done: 9 steps" in longer.out
    last = load(run / "last.pt")
    assert "budget_steps" not in last["train_state"]
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert (saved["max_iters"], saved["max_time"]) == (9, None)
