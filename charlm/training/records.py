"""What a run records at its log, eval and checkpoint steps (rank 0's part): the `train` and
`eval` events with the eval's line and sample, the count of skipped updates, best.pt and
last.pt, and the final hyperparameters with their metrics."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from charlm.generation.decoding import NonFiniteOutput
from charlm.training import checkpoint, steps
from charlm.training.metrics import MetricsLogger
from charlm.training.run_objects import Run
from charlm.training.schedule import Clock

LN2 = math.log(2)


def report_skipped(run: Run, log: MetricsLogger, saved_step: int | None) -> None:
    """Wait for the device's bad-step counters; say how many updates were skipped since the
    last report, or stop the run after max_bad_steps in a row."""
    bad = run.state.bad
    new = bad.check(run.cfg.train.max_bad_steps, run.run_dir / "last.pt", saved_step)
    if new:
        log.message(f"step {run.state.step}: skipped {new} update(s) with a non-finite loss or "
                    f"gradient norm ({bad.reported} so far)")


def train_event(run: Run, loss: torch.Tensor, norm: torch.Tensor, lr: float,
                clock: Clock) -> dict[str, Any]:
    """The `train` event of a log step; restarts the tokens/s count."""
    state, now = run.state, clock.now()
    state.elapsed_s = clock.elapsed(now)
    event = dict(step=state.step, elapsed_s=round(state.elapsed_s, 3), tokens=state.tokens,
                 lr=lr, train_loss=loss.item(), grad_norm=norm.item(),
                 skipped_steps=state.bad.reported,
                 tokens_per_s=clock.tokens / (now - clock.t_log))
    clock.t_log, clock.tokens = now, 0
    return event


def write(run: Run, log: MetricsLogger, train_event: dict[str, Any] | None,
          losses: dict[str, float] | None, lr: float, improved: bool, save_last: bool,
          clock: Clock, stop: Callable[[], bool] | None = None) -> None:
    """Rank 0's part of a log, eval or checkpoint step: the log events, the eval's line and
    sample (cut short once stop() says so), then best.pt, last.pt and the step's checkpoint
    that train.keep_checkpoints keeps."""
    if train_event is not None:
        log.log("train", **train_event)
    if losses is not None:
        log_eval(run, log, losses, lr, improved, stop)
    if save_last or improved:
        run.state.elapsed_s = clock.elapsed()
        ckpt = checkpoint.collect(run.stateful(), config=run.cfg.to_dict(),
                                  vocab=run.task.vocab_state())
        # best.pt first: a last.pt on disk never counts a best val whose best.pt a crash kept
        # from being written (a resume from the older last.pt evaluates that step again).
        if improved:
            checkpoint.save(ckpt, run.run_dir / "best.pt")
        if save_last:
            checkpoint.save(ckpt, run.run_dir / "last.pt")
            keep = run.cfg.train.keep_checkpoints
            if keep:  # after last.pt: a crash in between loses no step a resume would redo
                path = steps.step_path(run.run_dir, run.state.step)
                path.parent.mkdir(exist_ok=True)
                checkpoint.save(ckpt, path, run.run_dir)
                steps.prune(run.run_dir, keep)


def log_eval(run: Run, log: MetricsLogger, losses: dict[str, float], lr: float,
             improved: bool, stop: Callable[[], bool] | None = None) -> None:
    """An eval's event, its line for the user and, if asked, a sample of the model: cut short
    once stop() says so, for a stop signal to end the run within seconds (the loop saves
    last.pt at the next step, as after any signal)."""
    state = run.state
    try:
        metrics, note, sample = run.task.eval_report(run.weights, stop)
    except NonFiniteOutput:  # max_bad_steps decides whether the run stops
        metrics, note, sample = {}, "", None
        log.message(f"step {state.step}: no sample, the model's outputs are not finite")
    log.log("eval", step=state.step, elapsed_s=round(state.elapsed_s, 3), tokens=state.tokens,
            lr=lr, train_loss=losses["train"], val_loss=losses["val"],
            val_bpc=losses["val"] / LN2, best_val_loss=state.best_val, **metrics)
    log.message(f"step {state.step}: train {losses['train']:.4f}, val {losses['val']:.4f} "
                f"({losses['val'] / LN2:.3f} bpc){note}, {state.elapsed_s:.1f}s{log.status()}"
                + (" *best" if improved else ""))
    if sample is not None:
        log.sample(sample, state.step)


def log_final(run: Run, log: MetricsLogger, final: dict[str, float]) -> None:
    """The run's hyperparameters with its final metrics (TensorBoard's HParams tab)."""
    log.hparams(run.cfg.to_dict(), {
        "hparams/best_val_loss": run.state.best_val,
        "hparams/final_val_loss": final["val"],
        "hparams/final_val_bpc": final["val"] / LN2,
        "hparams/final_train_loss": final["train"],
    }, run.state.step)
