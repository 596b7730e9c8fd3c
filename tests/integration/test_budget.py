"""The time budget of a run on an injected clock (`Machine`): the schedule along the elapsed
time, a machine that slows down or speeds up mid-run, a resume, a budget the first evaluation
uses up, and what a finished budget refuses."""

import json
import signal
from pathlib import Path

import pytest
import torch
import yaml

from charlm.training import loop as train_module
from charlm.training.checkpoint import load
from charlm.training.faults import Interrupted
from charlm.training.loop import train
from charlm.training.resume import resume_config
from tests.helpers import files_under, signal_after_steps, with_


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


def events(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def budgeted(cfg, seconds: float = 100.0, **train):
    return with_(cfg, train={"max_time": seconds, "eval_interval": 20, "log_interval": 1,
                             **train}, optim={"min_lr": 0.0})


def test_a_budget_ends_within_it_with_the_rate_decayed_along_the_time(tiny_cfg, monkeypatch):
    """1 s a step, 2 s an evaluation: the run ends once one more step and the final evaluation
    would not fit, and the rate it ends at has decayed to nearly nothing."""
    machine = Machine(monkeypatch)
    cfg = budgeted(tiny_cfg)
    state = train(cfg, now=machine.now)
    run = Path(cfg.train.out_dir)
    assert 96.0 <= state.elapsed_s <= 100.0 and state.step == state.budget_steps
    assert load(run / "last.pt")["train_state"]["budget_steps"] == state.step
    evals = [e["step"] for e in events(run, "eval")]
    assert evals == [*range(20, state.step, 20), state.step]
    lrs = [e["lr"] for e in events(run, "train")]
    warmup = cfg.optim.warmup_iters
    assert lrs[warmup:] == sorted(lrs[warmup:], reverse=True)
    assert lrs[warmup] == cfg.optim.lr and lrs[-1] < 0.1 * cfg.optim.lr
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert (saved["max_iters"], saved["max_time"]) == (60, 100.0)  # as given: never rewritten


def test_a_machine_that_slows_tenfold_halfway_still_ends_within_the_budget(tiny_cfg,
                                                                          monkeypatch):
    """From 50 s on a step takes 10 s and an evaluation 20 s: the reserve follows the pace,
    and the run ends before the final evaluation would no longer fit."""
    machine = Machine(monkeypatch, step_s=lambda t: 1.0 if t < 50 else 10.0)
    state = train(budgeted(tiny_cfg), now=machine.now)
    assert state.elapsed_s <= 100.0 and state.step == state.budget_steps < 70


def test_a_machine_that_speeds_up_uses_the_time(tiny_cfg, monkeypatch):
    machine = Machine(monkeypatch, step_s=lambda t: 1.0 if t < 30 else 0.25)
    cfg = budgeted(tiny_cfg, seconds=60.0)
    state = train(cfg, now=machine.now)
    assert 57.0 <= state.elapsed_s <= 60.0 and state.step > 130
    lrs = [e["lr"] for e in events(Path(cfg.train.out_dir), "eval")]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < 0.05 * cfg.optim.lr


def test_a_resumed_budget_goes_on_from_the_time_spent(tiny_cfg, tmp_path, monkeypatch):
    base = budgeted(tiny_cfg, seconds=60.0, out_dir=str(tmp_path / "split"))
    signal_after_steps(monkeypatch, {30: [signal.SIGTERM]})
    with pytest.raises(Interrupted):
        train(base, now=Machine(monkeypatch).now)
    run = tmp_path / "split"
    stopped = load(run / "last.pt")["train_state"]
    assert stopped["step"] == 30 and "budget_steps" not in stopped
    monkeypatch.undo()
    state = train(resume_config(run, None, []), resume=True, now=Machine(monkeypatch).now)
    assert stopped["elapsed_s"] < 60.0 - 20 and 56.0 <= state.elapsed_s <= 60.0
    assert state.step == state.budget_steps > 45


def test_a_budget_its_first_evaluation_uses_up_ends_there_with_what_it_saved(
        tiny_cfg, monkeypatch):
    """A 10 s budget whose evaluations take 20 s (steps at 1 s each): until one is measured,
    an evaluation counts as train.eval_iters (4) steps, so the run ends at step 5 (5 s gone,
    1 s a step and 4 s of evaluation left) and overruns by what its one evaluation took over
    that, with best.pt and last.pt written."""
    machine = Machine(monkeypatch, eval_steps=20.0)
    cfg = with_(tiny_cfg, train={"max_time": 10.0, "eval_interval": 20, "log_interval": 1000})
    state = train(cfg, now=machine.now)
    run = Path(cfg.train.out_dir)
    assert state.step == state.budget_steps == 5 and state.elapsed_s == 25.0
    assert load(run / "last.pt")["train_state"]["step"] == 5
    assert load(run / "best.pt")["train_state"]["step"] == 5
    assert [e["step"] for e in events(run, "eval")] == [5]


def test_a_finished_budget_refuses_what_it_cannot_apply_and_trains_on_without_it(
        cli, tiny_cfg, monkeypatch):
    """A finished --time run resumed with --set train.max_iters=2000 or --time 30s said "done"
    with exit 0, trained nothing, and config.yaml then recorded a budget never applied. Each is
    one error now, every file as it was; dropping the budget trains on to max_iters."""
    cfg = with_(tiny_cfg, train={"max_time": 12.0, "eval_interval": 100, "eval_iters": 1,
                                 "sample_chars": 0})
    steps = train(cfg, now=Machine(monkeypatch).now).step
    monkeypatch.undo()
    run = Path(cfg.train.out_dir)
    before = files_under(run)
    how = "--set train.max_time=null --set train.max_iters=N"
    ended = (f"the run's time budget train.max_time=12.0s ended it at step {steps}, its "
             f"schedule decayed to the end; to train to another step, resume with {how}")
    for args, message in [
        (["--set", "train.max_iters=2000"],
         f"--resume: train.max_iters=2000 cannot apply: {ended}"),
        (["--time", "30s"], f"--resume: train.max_time=30.0s cannot apply: {ended}"),
        ([], f"--resume: nothing to train: {run / 'last.pt'} is at step {steps} and its time "
             f"budget train.max_time=12.0s ended there; to train on, resume with "
             f"{how} (N above {steps})"),
    ]:
        result = cli("train", "--out", run, "--resume", *args)
        assert (result.code, result.err) == (2, f"error: {message}\n")
        assert files_under(run) == before
    longer = cli("train", "--out", run, "--resume", "--set", "train.max_time=null",
                 "--set", f"train.max_iters={steps + 2}")
    assert longer.code == 0 and f"done: {steps + 2} steps" in longer.out
    assert "budget_steps" not in load(run / "last.pt")["train_state"]
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert (saved["max_iters"], saved["max_time"]) == (steps + 2, None)


def test_an_older_versions_planned_budget_is_no_end_on_resume(tiny_cfg):
    """Versions that planned a budget saved the planned last step as budget_steps while the
    run went on: such a checkpoint resumed with another budget is not refused as a budget that
    ended (it ended nowhere), and trains on."""
    cfg = with_(tiny_cfg, train={"max_iters": 4, "eval_interval": 4, "sample_chars": 0})
    train(cfg)
    run = Path(cfg.train.out_dir)
    ckpt = load(run / "last.pt")
    ckpt["train_state"]["budget_steps"] = 85
    ckpt["config"]["train"]["max_time"] = 100.0
    torch.save(ckpt, run / "last.pt")
    (run / "config.yaml").unlink()  # the checkpoint's config is the run's
    resumed = resume_config(run, None, ["train.max_time=200", "train.eval_interval=2"])
    assert resumed.train.max_time == 200.0
