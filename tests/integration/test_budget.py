"""The time budget of a run on an injected clock (`Machine`): the plan and the schedule laid
over it, a machine that slows down or speeds up mid-run, a resume, an interrupt."""

import json
import signal
from pathlib import Path

import pytest
import torch
import yaml

from charlm.training import budget
from charlm.training import loop as train_module
from charlm.training.checkpoint import load
from charlm.training.faults import Interrupted
from charlm.training.loop import lr_at, train
from charlm.training.run_dir import resume_config
from tests.helpers import assert_same_weights, files_under, signal_after_steps, with_


class Machine:
    """A clock (`now`, for train(now=...)) on which a training step takes `step_s(t)` seconds
    and an evaluation `eval_steps` steps' worth at that speed; nothing else takes time."""

    def __init__(self, monkeypatch, step_s=lambda t: 1.0, eval_steps: float = 2.0):
        self.t = 0.0
        real_step, real_eval = train_module.train_step, train_module.evaluate

        def step(*args, **kwargs):
            self.t += step_s(self.t)
            return real_step(*args, **kwargs)

        def evaluate(*args, **kwargs):
            self.t += eval_steps * step_s(self.t)
            return real_eval(*args, **kwargs)

        monkeypatch.setattr(train_module, "train_step", step)
        monkeypatch.setattr(train_module, "evaluate", evaluate)

    def now(self) -> float:
        return self.t


@pytest.fixture
def quick_timer(monkeypatch):
    """Steps timed for no minimum time: the plan is made after step 4 (1 + 3 timed)."""
    monkeypatch.setattr(budget, "TIMING_MAX_S", 0.0)


def events(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def budgeted(cfg, seconds: float = 100.0, **train):
    return with_(cfg, train={"max_time": seconds, "eval_interval": 20, "log_interval": 1000,
                             **train})


def test_a_budget_plans_its_steps_and_lays_the_schedule_over_them(tiny_cfg, monkeypatch,
                                                                  capsys):
    """1 s a step, 2 s an evaluation: timed for 5 s (steps 2-6), then planned to end by 97 s:
    (97 - 8 s gone - 2 s final eval) / 1.1 s a step with its evaluations = 79 steps more."""
    machine = Machine(monkeypatch)
    cfg = budgeted(tiny_cfg)
    state = train(cfg, now=machine.now)
    run = Path(cfg.train.out_dir)
    assert state.step == state.budget_steps == 85 and state.elapsed_s == 97.0
    assert "time budget 1m40s: 85 steps (1000 ms a step, 2.0s an eval" in capsys.readouterr().out
    assert [e["step"] for e in events(run, "eval")] == [6, 20, 40, 60, 80, 85]  # 6: timed
    plan = load(run / "last.pt")["train_state"]["budget"]
    assert plan == {"steps": 85, "anchor_step": 5, "anchor_progress": 0.0, "step_s": 1.0,
                    "eval_steps": 2.0, "save_s": 0.0}
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert (saved["max_iters"], saved["max_time"]) == (60, 100.0)  # as given: never rewritten
    # Before the plan, past warmup (5 steps), the rate is the peak; after it, the cosine over 85.
    optim, lrs = cfg.optim, {e["step"]: e["lr"] for e in events(run, "eval")}
    assert lrs[6] == pytest.approx(optim.lr, rel=1e-12)
    for step in (20, 40, 60, 80, 85):
        assert lrs[step] == pytest.approx(lr_at(step - 1, optim, 85), abs=1e-12)


def test_a_machine_that_slows_tenfold_halfway_still_ends_within_the_budget(tiny_cfg, monkeypatch,
                                                                          capsys):
    """Planned at 1 s a step for 85 steps; from 50 s on a step takes 10 s (and an evaluation
    20 s). A plan fixed once would end after about 460 s; this one ends when the final
    evaluation would no longer fit after one more step."""
    machine = Machine(monkeypatch, step_s=lambda t: 1.0 if t < 50 else 10.0)
    state = train(budgeted(tiny_cfg), now=machine.now)
    assert state.elapsed_s <= 100.0 and state.step == state.budget_steps < 85
    assert state.elapsed_s + 10.0 + 20.0 > 100.0  # not a step more would have fit
    out = capsys.readouterr().out
    assert f"1m00s gone: {state.step} steps at 10000 ms a step (planned 85)" in out


def test_a_machine_that_speeds_up_plans_more_steps_and_decays_without_a_jump(tiny_cfg,
                                                                             monkeypatch):
    machine = Machine(monkeypatch, step_s=lambda t: 1.0 if t < 30 else 0.25)
    cfg = budgeted(tiny_cfg)
    state = train(cfg, now=machine.now)
    assert 94.0 <= state.elapsed_s <= 100.0 and state.step == state.budget_steps > 200
    lrs = [e["lr"] for e in events(Path(cfg.train.out_dir), "eval")]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] == pytest.approx(cfg.optim.min_lr, rel=1e-3)


def test_a_resumed_budget_continues_its_plan_bitwise(tiny_cfg, tmp_path, monkeypatch):
    base = budgeted(tiny_cfg, seconds=60.0)
    straight = train(with_(base, train={"out_dir": str(tmp_path / "straight")}),
                     now=Machine(monkeypatch).now)
    run = tmp_path / "split"
    machine = Machine(monkeypatch)
    signal_after_steps(monkeypatch, {30: [signal.SIGTERM]})
    with pytest.raises(Interrupted):
        train(with_(base, train={"out_dir": str(run)}), now=machine.now)
    assert load(run / "last.pt")["train_state"]["step"] == 30
    monkeypatch.undo()
    machine = Machine(monkeypatch)
    state = train(resume_config(run, None, []), resume=True, now=machine.now)
    assert state.step == straight.step and state.budget == straight.budget
    assert_same_weights(tmp_path / "straight" / "last.pt", run / "last.pt")


def test_a_run_interrupted_before_its_plan_times_again(tiny_cfg, monkeypatch):
    cfg = budgeted(tiny_cfg)
    signal_after_steps(monkeypatch, {2: [signal.SIGINT]})
    with pytest.raises(Interrupted):
        train(cfg, now=Machine(monkeypatch).now)
    run = Path(cfg.train.out_dir)
    assert "budget_steps" not in load(run / "last.pt")["train_state"]  # a run without one
    monkeypatch.undo()
    state = train(resume_config(run, None, []), resume=True, now=Machine(monkeypatch).now)
    # timed over steps 4-8 on resume (2 s were gone), then planned: 8 + (97 - 10 - 2) / 1.1
    assert state.step == state.budget_steps == 85 and state.budget["anchor_step"] == 5


def test_a_plan_from_before_the_budget_followed_the_clock_keeps_its_steps(tiny_cfg,
                                                                         monkeypatch):
    """A checkpoint that saved budget_steps alone: its steps stand, its pace is timed again."""
    cfg = budgeted(tiny_cfg)
    signal_after_steps(monkeypatch, {30: [signal.SIGTERM]})
    with pytest.raises(Interrupted):
        train(cfg, now=Machine(monkeypatch).now)
    run = Path(cfg.train.out_dir)
    ckpt = load(run / "last.pt")
    del ckpt["train_state"]["budget"]
    torch.save(ckpt, run / "last.pt")
    monkeypatch.undo()
    state = train(resume_config(run, None, []), resume=True, now=Machine(monkeypatch).now)
    assert state.step == state.budget_steps == 85
    assert state.budget["step_s"] == 1.0 and state.budget["anchor_step"] == 5


def test_a_budget_its_first_evaluation_uses_up_ends_there_with_what_it_saved(
        tiny_cfg, quick_timer, monkeypatch, capsys):
    """A 10 s budget whose first evaluation takes 20 s (timed steps at 1 s each): the run
    overran to 41 s and exited 2 naming no cause (then "too short", still exit 2). Now it ends
    at the step of that evaluation, best.pt and last.pt written, and says why."""
    machine = Machine(monkeypatch, eval_steps=20.0)
    cfg = with_(tiny_cfg, train={"max_time": 10.0, "eval_interval": 20, "log_interval": 1000})
    state = train(cfg, now=machine.now)
    run = Path(cfg.train.out_dir)
    assert state.step == state.budget_steps == 4 and state.elapsed_s == 24.0
    assert load(run / "last.pt")["train_state"]["step"] == 4
    assert load(run / "best.pt")["train_state"]["step"] == 4
    assert [e["step"] for e in events(run, "eval")] == [4]  # no second, final evaluation
    out = capsys.readouterr().out
    assert ("time budget 10.0s used up: 24.0s went to starting, 4 timed steps (1000 ms each) "
            "and an evaluation with its checkpoints (20.0s of it), which leaves no time for "
            "another; the run ends at step 4 with what that evaluation saved (best.pt, "
            "last.pt); give at least 54.0s to train further (or set train.max_iters without a "
            "budget)") in out


def test_a_finished_budget_refuses_what_it_cannot_apply_and_trains_on_without_it(
        cli, tiny_cfg, monkeypatch):
    """A finished --time run resumed with --set train.max_iters=2000 or --time 30s said "done"
    with exit 0, trained nothing, and config.yaml then recorded a budget never applied. Each is
    one error now, every file as it was; dropping the budget trains on to max_iters. (12 s at
    1 s a step: timed to step 4, 6 s gone, planned 3 more.)"""
    cfg = with_(tiny_cfg, train={"max_time": 12.0, "eval_interval": 100, "eval_iters": 1,
                                 "sample_chars": 0})
    assert train(cfg, now=Machine(monkeypatch).now).step == 7
    monkeypatch.undo()
    run = Path(cfg.train.out_dir)
    before = files_under(run)
    how = "--set train.max_time=null --set train.max_iters=N"
    for args, message in [
        (["--set", "train.max_iters=2000"],
         "--resume: train.max_iters=2000 cannot apply: the run's time budget "
         "train.max_time=12.0s planned its steps (to step 7), its schedule laid over them; to "
         f"train to another step, resume with {how}"),
        (["--time", "30s"],
         "--resume: train.max_time=30.0s cannot apply: the run's time budget train.max_time=12.0s "
         "planned its steps (to step 7), its schedule laid over them; to train to another step, "
         f"resume with {how}"),
        ([], f"--resume: nothing to train: {run / 'last.pt'} is at step 7 and its time budget "
             "train.max_time=12.0s ended there; to train on, resume with "
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


def test_the_first_plans_own_write_is_not_taken_for_a_slower_step(tiny_cfg, monkeypatch, capsys):
    """The first plan writes last.pt again, with the plan: that write takes time too (here 3 s
    each, as a 10M-parameter model's checkpoint took about a second on an H200) and is paused
    out like every other, so a machine whose speed holds keeps its first plan."""
    machine = Machine(monkeypatch)
    real_write = train_module.write

    def write(*args, **kwargs):
        machine.t += 3.0
        return real_write(*args, **kwargs)

    monkeypatch.setattr(train_module, "write", write)
    state = train(budgeted(tiny_cfg), now=machine.now)
    out = capsys.readouterr().out
    assert "gone:" not in out  # no new plan
    assert state.step == state.budget_steps and state.elapsed_s <= 100.0
