"""Faults a run survives: stop signals, SIGKILL, crashes between saves and non-finite steps."""

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from charlm.config.loading import save_config
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.generation import text as sampling
from charlm.model.gpt import GPT
from charlm.training import checkpoint
from charlm.training import loop as train_module
from charlm.training.faults import Interrupted
from charlm.training.loop import train
from charlm.training.resume import resume_config
from tests.helpers import ROOT, assert_same_weights, signal_after_steps, with_


def test_sigterm_saves_last_then_resume_is_exact(tiny_cfg, tmp_path, monkeypatch):
    base = with_(tiny_cfg, train={"max_iters": 30})
    train(with_(base, train={"out_dir": str(tmp_path / "straight")}))
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    run = tmp_path / "split"
    signal_after_steps(monkeypatch, {13: [signal.SIGTERM]})
    with pytest.raises(Interrupted) as e:
        train(with_(base, train={"out_dir": str(run)}))
    assert str(e.value) == (f"interrupted by SIGTERM at step 13: saved {run / 'last.pt'}; "
                            f"continue with `charlm train --out {run} --resume`")
    assert e.value.exit_code == 143
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 13
    monkeypatch.undo()
    assert train(resume_config(run, None, []), resume=True).step == 30
    assert_same_weights(tmp_path / "straight" / "last.pt", run / "last.pt")


def test_second_ctrl_c_aborts_without_partial_file(tiny_cfg, monkeypatch):
    cfg = with_(tiny_cfg, train={"eval_interval": 2})
    run = Path(cfg.train.out_dir)
    saved: list[bytes] = []
    real_save = torch.save

    def save_then_ctrl_c(obj, f):  # the second Ctrl-C lands in the middle of the interrupt save
        saved.append((run / "last.pt").read_bytes() if (run / "last.pt").exists() else b"")
        if len(saved) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        real_save(obj, f)

    signal_after_steps(monkeypatch, {3: [signal.SIGINT]})
    monkeypatch.setattr(torch, "save", save_then_ctrl_c)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as e:
        train(cfg)
    assert not isinstance(e.value, Interrupted)
    assert signal.getsignal(signal.SIGINT) == handler
    assert len(saved) == 3  # best.pt and last.pt at step 2, then the aborted save at step 3
    assert (run / "last.pt").read_bytes() == saved[-1]
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 2
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize("name, quote", [("run", ""), ("my run ελ", "'")])
def test_cli_train_exits_130_on_ctrl_c(cli, tmp_path, corpus, monkeypatch, name, quote):
    """The command it suggests can be pasted into a shell: a run dir with a space (`charlm train
    "my notes.txt"` trains into runs/my notes) is quoted."""
    signal_after_steps(monkeypatch, {4: [signal.SIGINT]})
    run = tmp_path / name
    result = cli("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run)
    assert result.code == 130
    assert result.err.endswith(f"interrupted by SIGINT at step 4: saved {run / 'last.pt'}; "
                               f"continue with `charlm train --out {quote}{run}{quote} --resume`\n")
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 4


def test_resume_after_sigkill_is_exact(cli, tiny_cfg, tmp_path):
    """A real `charlm train` process killed between two checkpoints, resumed from its last.pt,
    ends with the same weights as an uninterrupted run (same max_iters, so the same schedule)."""
    cfg = with_(tiny_cfg, train={"max_iters": 80, "eval_interval": 10, "eval_iters": 1,
                                 "log_interval": 1})
    train(with_(cfg, train={"out_dir": str(tmp_path / "straight")}))
    run = Path(cfg.train.out_dir)
    config = tmp_path / "run.yaml"
    save_config(cfg, config)
    proc = subprocess.Popen([sys.executable, "-m", "charlm", "train", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []
            steps = [json.loads(line)["step"] for line in lines]  # complete lines only
            if (run / "last.pt").exists() and steps and steps[-1] % 10:  # between checkpoints
                break
            time.sleep(0.002)
        proc.kill()
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    killed_at = checkpoint.load(run / "last.pt")["train_state"]["step"]
    assert killed_at % 10 == 0 and 10 <= killed_at < 80
    result = cli("train", "--out", run, "--resume")
    assert result.code == 0, result.err
    assert "done: 80 steps" in result.out
    assert_same_weights(tmp_path / "straight" / "last.pt", run / "last.pt")


class Killed(BaseException):
    """A process death in the middle of the loop (nothing after it runs, as after SIGKILL)."""


@pytest.mark.parametrize("dies_in", ["last.pt", "best.pt"])
def test_a_crash_between_the_saves_of_an_improved_eval_keeps_best_pt_the_best(dies_in, tiny_cfg,
                                                                               monkeypatch):
    """A run killed while it writes the checkpoints of its final eval, which improved, and then
    resumed: best.pt is that step's model, the one with the lowest val (when last.pt was
    written first, a death before best.pt left last.pt counting a best val that no best.pt
    held, and the resume, with nothing left to train, kept the older best.pt for good)."""
    cfg = with_(tiny_cfg, train={"max_iters": 4, "eval_interval": 2, "eval_iters": 1,
                                 "sample_chars": 0})
    run = Path(cfg.train.out_dir)
    real_save = checkpoint.save

    def save_or_die(state, path):
        if state["train_state"]["step"] == 4 and Path(path).name == dies_in:
            raise Killed
        real_save(state, path)

    monkeypatch.setattr(checkpoint, "save", save_or_die)
    with pytest.raises(Killed):
        train(cfg)
    monkeypatch.undo()
    train(cfg, resume=True)
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    vals = {e["step"]: e["val_loss"] for e in evals if e["event"] == "eval"}
    assert list(vals) == [2, 4] and vals[4] < vals[2]
    best = checkpoint.load(run / "best.pt")
    assert best["train_state"]["step"] == 4 and best["train_state"]["best_val"] == vals[4]
    assert_same_weights(run / "best.pt", run / "last.pt")


def nan_loss_at_steps(monkeypatch, bad: set[int]) -> None:
    """Make the training loss NaN at the given steps (1-based; grad_accum 1)."""
    real, calls = GPT.forward, [0]

    def forward(self, idx, targets=None, cache=None):
        logits, loss = real(self, idx, targets, cache)
        if targets is not None and self.training:
            calls[0] += 1
            if calls[0] in bad:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


def weights_after_each_step(monkeypatch) -> list[list[torch.Tensor]]:
    real, weights = train_module.train_step, []

    def step(model, *args):
        out = real(model, *args)
        weights.append([p.detach().clone() for p in model.parameters()])
        return out

    monkeypatch.setattr(train_module, "train_step", step)
    return weights


def test_metrics_of_skipped_steps_are_strict_json_with_null(tiny_cfg, monkeypatch):
    """A skipped step's NaN loss and grad norm are written as null, not as NaN, which strict
    JSON parsers reject."""
    cfg = with_(tiny_cfg, train={"max_iters": 5, "log_interval": 1, "eval_interval": 100})
    nan_loss_at_steps(monkeypatch, {3})
    train(cfg)

    def strict(constant):
        raise ValueError(f"not JSON: {constant}")

    lines = Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()
    events = [json.loads(line, parse_constant=strict) for line in lines]
    losses = {e["step"]: e["train_loss"] for e in events if e["event"] == "train"}
    assert losses[3] is None and all(isinstance(losses[s], float) for s in (1, 2, 4, 5))


def test_non_finite_loss_skips_the_update_and_is_counted(tiny_cfg, monkeypatch, capsys):
    cfg = with_(tiny_cfg, train={"max_iters": 8, "log_interval": 1, "eval_interval": 100})
    nan_loss_at_steps(monkeypatch, {3, 4})
    weights = weights_after_each_step(monkeypatch)
    state = train(cfg)
    assert state.bad.state_dict()["skipped_steps"] == 2
    for step in (3, 4):  # weights after steps 3 and 4 are those after step 2
        assert all(torch.equal(a, b) for a, b in zip(weights[1], weights[step - 1], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights[1], weights[4], strict=True))
    events = [json.loads(line) for line in
              Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()]
    assert [e["skipped_steps"] for e in events if e["event"] == "train"] == [0, 0, 1, 2, 2, 2, 2, 2]
    assert "step 3: skipped 1 update(s) with a non-finite loss or gradient norm (1 so far)" \
        in capsys.readouterr().out
    last = checkpoint.load(Path(cfg.train.out_dir, "last.pt"))
    assert last["train_state"]["skipped_steps"] == 2
    assert int(last["optimizer"]["state"][0]["step"]) == 6  # 8 steps, 2 updates skipped


def test_too_many_bad_steps_before_any_checkpoint_say_start_over(tiny_cfg, monkeypatch):
    cfg = with_(tiny_cfg, train={"max_iters": 20, "log_interval": 1, "eval_interval": 10,
                                 "max_bad_steps": 2})
    nan_loss_at_steps(monkeypatch, set(range(1, 21)))
    with pytest.raises(CharlmError) as e:
        train(cfg)
    assert str(e.value) == (
        "training stopped: 2 steps in a row, up to step 2, had a non-finite loss or gradient "
        "norm (their updates were skipped); no checkpoint was written; lower optim.lr, raise "
        "optim.warmup_iters or check the data, then start over with --overwrite")


def test_too_many_bad_steps_stop_the_run_and_keep_the_checkpoint(tiny_cfg, monkeypatch):
    cfg = with_(tiny_cfg, train={"max_iters": 20, "log_interval": 1, "eval_interval": 2,
                                 "max_bad_steps": 3})
    nan_loss_at_steps(monkeypatch, set(range(4, 21)))
    weights = weights_after_each_step(monkeypatch)
    last_pt = Path(cfg.train.out_dir, "last.pt")
    with pytest.raises(CharlmError) as e:
        train(cfg)
    assert str(e.value) == (
        f"training stopped: 3 steps in a row, up to step 6, had a non-finite loss or gradient "
        f"norm (their updates were skipped); the last checkpoint {last_pt} (step 4) is intact; "
        "lower optim.lr, raise optim.warmup_iters or check the data, then resume or start over")
    assert len(weights) == 6
    last = checkpoint.load(last_pt)
    assert last["train_state"]["step"] == 4
    model = GPT(cfg.model, len(last["vocab"]))
    model.load_state_dict(last["model"])
    assert all(torch.equal(a, b) for a, b in zip(weights[2], model.parameters(), strict=True))


def interrupted_after_two_bad_steps(tiny_cfg: RunConfig, monkeypatch: pytest.MonkeyPatch,
                                    max_bad_steps: int) -> RunConfig:
    """An 8-step run whose steps 3 and 4 are bad, stopped by SIGTERM after step 4 (last.pt at
    step 4); the patches are undone, ready for the resume's own."""
    cfg = with_(tiny_cfg, train={"max_iters": 8, "log_interval": 1, "eval_interval": 100,
                                 "max_bad_steps": max_bad_steps, "sample_chars": 0})
    nan_loss_at_steps(monkeypatch, {3, 4})
    signal_after_steps(monkeypatch, {4: [signal.SIGTERM]})
    with pytest.raises(Interrupted):
        train(cfg)
    monkeypatch.undo()
    return cfg


def test_a_streak_of_bad_steps_goes_on_across_an_interrupt_and_resume(tiny_cfg, monkeypatch):
    """Steps 3 to 5 are bad and max_bad_steps is 3: interrupted at step 4 (two bad so far) and
    resumed, the run stops at step 5 as it would have without the interrupt."""
    cfg = interrupted_after_two_bad_steps(tiny_cfg, monkeypatch, max_bad_steps=3)
    nan_loss_at_steps(monkeypatch, {1})  # step 5, the first of the resumed run
    last_pt = Path(cfg.train.out_dir, "last.pt")
    with pytest.raises(CharlmError) as e:
        train(cfg, resume=True)
    assert str(e.value).startswith("training stopped: 3 steps in a row, up to step 5, had a "
                                   f"non-finite loss or gradient norm (their updates were "
                                   f"skipped); the last checkpoint {last_pt} (step 4) is intact")


def test_a_resume_with_max_bad_steps_below_the_streak_stops_at_the_next_bad_step(
        tiny_cfg, monkeypatch):
    """Interrupted after two bad steps in a row (max_bad_steps 5), resumed with max_bad_steps 2:
    the streak is already past the new limit, and the next bad step stops the run (the streak
    counted 3, 4, ... and never equalled 2, so the run went on with every update skipped)."""
    cfg = interrupted_after_two_bad_steps(tiny_cfg, monkeypatch, max_bad_steps=5)
    nan_loss_at_steps(monkeypatch, {1, 2, 3, 4})  # steps 5 to 8, all of the resumed run
    with pytest.raises(CharlmError, match=r"^training stopped: 2 steps in a row, up to step 5,"):
        train(with_(cfg, train={"max_bad_steps": 2}), resume=True)


def test_an_eval_of_a_diverged_model_logs_no_sample_and_the_run_goes_on(tiny_cfg, capsys):
    # lr 1e9: step 1 sends the weights so far that every later loss (and the eval's sampled
    # preview) is NaN; the preview must not end the run, max_bad_steps decides.
    cfg = with_(tiny_cfg, optim={"lr": 1e9, "min_lr": 0.0, "warmup_iters": 0},
                train={"max_iters": 3, "eval_interval": 3, "eval_iters": 1, "max_bad_steps": 10})
    state = train(cfg)
    assert (state.step, state.bad.state_dict()["skipped_steps"]) == (3, 2)
    assert "step 3: no sample, the model's outputs are not finite" in capsys.readouterr().out
    assert checkpoint.load(Path(cfg.train.out_dir, "last.pt"))["train_state"]["step"] == 3


LONG_NATIVE_CALL = """
import time, torch
from charlm.training.faults import StopSignals
a = torch.randn(512, 512)
a @ a
t = time.perf_counter()
a @ a
n = min(int(512 * (30 / max(time.perf_counter() - t, 1e-4)) ** (1 / 3)), 12000)
x = torch.randn(n, n)  # one matmul of about 30 s: no bytecode runs until it ends
with StopSignals():
    print("ready", flush=True)
    x @ x
print("finished", flush=True)
"""


def test_a_second_signal_ends_a_long_native_call():
    """SIGTERM, a second SIGTERM and SIGINT were ignored for 20 minutes while the main thread
    sat in one attention backward over a huge block: Python runs handlers between bytecodes."""
    proc = subprocess.Popen([sys.executable, "-c", LONG_NATIVE_CALL], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # The first one is said at once (it was said only once the matmul had ended).
        assert select.select([proc.stderr], [], [], 10)[0], "the first SIGTERM said nothing"
        first = proc.stderr.readline() + proc.stderr.readline()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        waited = time.monotonic() - t0
    finally:
        proc.kill()
    assert first == ("\nSIGTERM: finishing this step and saving last.pt (press Ctrl-C again to "
                     "abort without saving)\n")
    assert (proc.returncode, out) == (143, "")
    assert err.endswith("aborted: no checkpoint yet\n")  # StopSignals() of a run not saved yet
    assert waited < 10  # the grace of 2 s, not the matmul's 30


def test_a_signal_during_an_evaluation_stops_it_between_batches(tiny_cfg, monkeypatch):
    """SIGINT during a long evaluation (train.eval_iters=20000) took 82 s to land: the eval
    ran to its end first."""
    cfg = with_(tiny_cfg, train={"eval_interval": 5, "eval_iters": 200})
    real_evaluate, forwards = train_module.evaluate, []

    def evaluate_after_a_signal(model, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # handled before the first eval batch
        handle = model.register_forward_hook(lambda *_: forwards.append(1))
        try:
            return real_evaluate(model, *args, **kwargs)
        finally:
            handle.remove()

    monkeypatch.setattr(train_module, "evaluate", evaluate_after_a_signal)
    with pytest.raises(Interrupted) as e:
        train(cfg)
    run = Path(cfg.train.out_dir)
    assert e.value.exit_code == 130 and forwards == []
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 5
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "eval"]


def test_ctrl_c_during_a_ten_million_character_eval_sample_ends_the_run(cli, tmp_path, corpus,
                                                                         monkeypatch):
    """With train.sample_chars=10,000,000 the first Ctrl-C waited for the eval's sample to end
    (hours on a CPU). The sample now stops at the next token once a stop signal has come; the
    run saves last.pt at the next step and exits 130, as after any Ctrl-C. Here the signal comes
    as the sample starts, and a sample that goes on past 1,000 tokens fails the test."""
    real, tokens = sampling.generate, [0]

    def generate(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        for ids in real(*args, **kwargs):
            tokens[0] += 1
            assert tokens[0] < 1000, "the eval's sample went on after Ctrl-C"
            yield ids

    monkeypatch.setattr(sampling, "generate", generate)
    run = tmp_path / "run"
    t0 = time.perf_counter()
    result = cli("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run,
                 "--set", "train.sample_chars=10000000", "--set", "train.eval_interval=2",
                 "--set", "train.eval_iters=1")
    assert time.perf_counter() - t0 < 20
    assert result.code == 130 and tokens == [1]
    assert result.err.endswith(f"interrupted by SIGINT at step 3: saved {run / 'last.pt'}; "
                               f"continue with `charlm train --out {run} --resume`\n")
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_sigkill_at_random_moments_leaves_a_complete_checkpoint(tmp_path):
    """A child process rewrites last.pt in a loop; killed at random moments, it must always
    leave the old or the new complete file."""
    path = tmp_path / "last.pt"
    # Built before forking, so the child only serialises and writes (no torch thread pools).
    states = [{"step": i, "model": {"w": torch.full((64, 1024), float(i))}} for i in range(4)]
    checkpoint.save(states[0], path)
    rng = random.Random(0)
    for _ in range(25):
        pid = os.fork()
        if pid == 0:  # the writer; it never returns into pytest
            try:
                i = 0
                while True:
                    i += 1
                    checkpoint.save(states[i % len(states)], path)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        state = checkpoint.load(path)
        assert torch.equal(state["model"]["w"], states[state["step"]]["model"]["w"])
    tmp_files = [p.name for p in tmp_path.iterdir() if p.name != "last.pt"]
    assert tmp_files, "no kill landed in the middle of a save"
    assert all(name.startswith(".last.pt.tmp-") for name in tmp_files)  # a killed writer's


def test_an_eval_cut_short_by_a_signal_runs_first_on_resume(tiny_cfg, tmp_path, monkeypatch):
    """SIGINT during the eval of step 5, then --resume: the weights came out right, but that
    eval never ran again (metrics.jsonl and best.pt skipped it). The resume runs it first: the
    run's evals, best.pt and last.pt are then those of an uninterrupted run."""
    base = with_(tiny_cfg, train={"max_iters": 10, "eval_interval": 5, "eval_iters": 2,
                                  "sample_chars": 0})
    train(with_(base, train={"out_dir": str(tmp_path / "straight")}))
    run = tmp_path / "split"
    real_evaluate = train_module.evaluate

    def evaluate_after_a_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # handled before the first eval batch
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate", evaluate_after_a_signal)
    with pytest.raises(Interrupted):
        train(with_(base, train={"out_dir": str(run)}))
    monkeypatch.undo()
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 5
    assert not (run / "best.pt").exists()
    assert train(resume_config(run, None, []), resume=True).step == 10

    def evals(path):
        lines = (path / "metrics.jsonl").read_text().splitlines()
        return [(e["step"], e["val_loss"]) for e in map(json.loads, lines) if e["event"] == "eval"]

    assert [step for step, _ in evals(run)] == [5, 10]
    assert evals(run) == evals(tmp_path / "straight")
    for name in ("best.pt", "last.pt"):
        assert_same_weights(tmp_path / "straight" / name, run / name)
    best = checkpoint.load(run / "best.pt")["train_state"]
    assert best["step"] == checkpoint.load(tmp_path / "straight" / "best.pt")[
        "train_state"]["step"]


def test_a_second_signal_before_any_checkpoint_says_there_is_none(tiny_cfg, monkeypatch,
                                                                   capfd):
    """The abort said "last.pt holds the last completed save" when the run had saved none."""
    run = Path(tiny_cfg.train.out_dir)
    real_save = torch.save

    def ctrl_c_then_save(obj, f):  # the second Ctrl-C lands in the first save of the run
        os.kill(os.getpid(), signal.SIGINT)
        real_save(obj, f)

    signal_after_steps(monkeypatch, {1: [signal.SIGINT]})
    monkeypatch.setattr(torch, "save", ctrl_c_then_save)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_cfg)
    assert capfd.readouterr().err.endswith("aborted: no checkpoint yet\n")
    assert not (run / "last.pt").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["int", "term"])
def test_a_second_signal_exits_128_plus_its_number_as_the_first_does(tiny_cfg, tmp_path, cli,
                                                                      monkeypatch, signum):
    """Two SIGTERMs ended `charlm train` with 130, Ctrl-C's code: the abort was a plain
    KeyboardInterrupt, which typer counts as Ctrl-C whatever the signal."""
    config = tmp_path / "run.yaml"
    save_config(tiny_cfg, config)
    signal_after_steps(monkeypatch, {2: [signum, signum]})
    result = cli("train", config)  # the lines go to fd 2 (os.write), checked in the tests above
    assert result.code == 128 + signum
    assert not (Path(tiny_cfg.train.out_dir) / "last.pt").exists()
