"""`train(cfg)` and its loop (set the learning rate, `train_step`, then maybe log, evaluate and
save, as the `Schedule` says), and what rank 0 records then. Under torchrun every rank runs the
loop, on values all ranks agree on (docs/distributed.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch

from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.generation.decoding import NonFiniteOutput
from charlm.runtime.device import resolve_device, seed_everything
from charlm.runtime.distributed import Dist, distributed
from charlm.runtime.precision import resolve_dtype
from charlm.runtime.profile import Profile, decide
from charlm.training import checkpoint
from charlm.training.evaluation import EvalStopped, evaluate
from charlm.training.faults import Interrupted, StopSignals
from charlm.training.metrics import MetricsLogger
from charlm.training.optimizer import set_lr, train_step
from charlm.training.parent import Parent
from charlm.training.resume import require_same_average, require_steps_left
from charlm.training.run_dir import check_run_dir, run_lock
from charlm.training.run_objects import Run, RunFiles, TrainState, build_run, wrap_model
from charlm.training.schedule import Clock, Schedule
from charlm.training.sizing import with_keys

LN2 = math.log(2)


def train(cfg: RunConfig, resume: bool = False, overwrite: bool = False,
          progress: bool | None = None, now: Callable[[], float] = time.perf_counter,
          parent: Parent | None = None, size: Collection[str] | None = None) -> TrainState:
    """Train (or resume) the run of `cfg` in `cfg.train.out_dir` (under torchrun, this rank's
    part). `now`: the run's clock (a test's); `parent`: the model a fresh fine-tune starts from;
    `size`: the keys the user set, to size a fresh run's model to train.max_time (None: as is)."""
    with (distributed(resolve_device(cfg.train.device)) as (dist, device),
          run_lock(Path(cfg.train.out_dir), dist.is_main)):
        return _train(cfg, dist, device, resume, overwrite, progress, now, parent, size)


def _train(cfg: RunConfig, dist: Dist, device: torch.device, resume: bool, overwrite: bool,
           progress: bool | None, now: Callable[[], float] = time.perf_counter,
           parent: Parent | None = None, size: Collection[str] | None = None) -> TrainState:
    clock = Clock(start=now(), now=now)
    run_dir = Path(cfg.train.out_dir)
    if cfg.train.batch_size % dist.world_size:
        raise CharlmError(
            f"train.batch_size {cfg.train.batch_size} does not split over {dist.world_size} "
            "processes; make it a multiple of the number of processes (nproc_per_node x nnodes)")
    check_run_dir(run_dir, resume, overwrite)
    # threads and dtype as the profile decides them here: the ranks of a DDP run take bf16 if all do
    profile = decide(cfg.train.threads, cfg.train.dtype, device)
    if not dist.all_ok(profile.dtype == "bfloat16") and profile.dtype == "bfloat16":
        profile = Profile(profile.threads, "float32", profile.why_threads,
                          "another rank measured bf16 slower")
    cfg = with_keys(cfg, {"train.threads": profile.threads, "train.dtype": profile.dtype})
    seed_everything(cfg.train.seed)
    # Every rank loads the same last.pt onto the CPU (`RNGState`); load_state_dict moves the rest.
    ckpt = checkpoint.load(run_dir / "last.pt") if resume else None
    if ckpt is not None:
        require_steps_left(cfg, ckpt, run_dir / "last.pt")
        require_same_average(cfg, ckpt, run_dir / "last.pt")
    run = build_run(cfg, dist, device, resolve_dtype(cfg.train.dtype, device), ckpt, parent,
                    None if resume else size)
    tc = run.cfg.train  # a model sized to the budget changes the config
    if ckpt is not None:
        checkpoint.restore(ckpt, run.stateful(), run_dir / "last.pt")
    wrap_model(run)
    clock.before, clock.eval_steps = run.state.elapsed_s, float(tc.eval_iters)
    if tc.max_time is None:  # a budget dropped on resume: max_iters rules
        run.state.budget_steps = None
    # A fresh run writes nothing (and --overwrite removes nothing) until its first step has run.
    files = RunFiles(run, clock, overwrite, run.state.step, progress, profile.line(device))
    stop = StopSignals(announce=dist.is_main, saved=ckpt is not None)
    try:
        if ckpt is not None:
            files.open()  # a resume's at once
        with stop:
            final = _loop(run, files, stop, clock, Schedule(run.cfg.optim, tc),
                          saved_step=run.state.step if resume else None)
        if final is not None:  # the hyperparameters with the final metrics: TensorBoard's HParams
            with dist.main_first():
                files.open().hparams(run.cfg.to_dict(), {
                    "hparams/best_val_loss": run.state.best_val,
                    "hparams/final_val_loss": final["val"],
                    "hparams/final_val_bpc": final["val"] / LN2,
                    "hparams/final_train_loss": final["train"],
                }, run.state.step)
    finally:
        files.close()
    return run.state


def _loop(run: Run, files: RunFiles, stop: StopSignals, clock: Clock, schedule: Schedule,
          saved_step: int | None) -> dict[str, float] | None:
    """Train to the schedule's last step: the latest eval's losses. `saved_step`: last.pt's step."""
    cfg, state, dist = run.cfg, run.state, run.dist
    final: dict[str, float] | None = None
    run.model.train()
    clock.t_log = clock.t_step = clock.now()
    if state.eval_due:  # a stop signal cut this step's eval short before the resume: run it now
        final = record(run, files.open(), stop, clock, None,
                       schedule.lr(state.step - 1, clock.elapsed()), True, True)
        if (signum := dist.agree(stop.signum)[0]) is not None:
            raise Interrupted(run.run_dir, state.step, signum)  # saved; eval_due if cut short again
    elapsed, step_s, final_s = clock.elapsed(), clock.step_s, clock.final_s()
    while not (state.step >= cfg.train.max_iters if cfg.train.max_time is None
               else state.budget_steps is not None):
        lr = schedule.lr(state.step, elapsed, step_s + final_s)
        set_lr(run.optimizer, lr, cfg.optim)
        drawn = run.sampler.tokens
        loss, norm, ok = train_step(run.step_model, run.optimizer, run.scaler, run.sampler, cfg,
                                    run.device, run.dtype, dist)
        if run.average is not None:
            run.average.update(run.model)
        state.step += 1
        state.tokens += run.sampler.tokens - drawn
        clock.stepped(run.sampler.tokens - drawn)
        state.bad.record(ok, state.step, cfg.train.max_bad_steps)
        log = files.open()  # a fresh run's, once its first step has run
        log.advance()
        signum, elapsed, step_s, final_s = dist.agree(stop.signum, clock.elapsed(),
                                                      clock.step_s, clock.final_s())
        last = schedule.is_last(state.step, elapsed, step_s, final_s)
        log_now, eval_now, save_now = schedule.due(state.step, last, signum is not None)
        if not (log_now or eval_now or save_now):
            continue  # the only steps that wait for the device are those below
        if last and cfg.train.max_time is not None:
            state.budget_steps = state.step  # saved with it: a resume has nothing left to do
        if new := state.bad.check(cfg.train.max_bad_steps, run.run_dir / "last.pt", saved_step):
            log.message(f"step {state.step}: skipped {new} update(s) with a non-finite loss or "
                        f"gradient norm ({state.bad.reported} so far)")
        event = train_event(run, loss, norm, lr, clock) if log_now else None
        losses = record(run, log, stop, clock, event, lr, eval_now, save_now)
        final = final if losses is None else losses
        if state.eval_due:  # cut short by a stop signal: last.pt is saved, the run stops
            signum, save_now = stop.signum, True
        saved_step = state.step if save_now else saved_step
        stop.saved = saved_step is not None
        if signum is not None and (not last or state.eval_due):  # last.pt saved
            raise Interrupted(run.run_dir, state.step, signum)
    return final


def record(run: Run, log: MetricsLogger, stop: StopSignals, clock: Clock,
           event: dict[str, Any] | None, lr: float, eval_now: bool, save_now: bool,
           ) -> dict[str, float] | None:
    """The log event, eval and checkpoints of the step just done (rank 0 writes), paused out
    of the training time; the eval's losses (None: no eval). An eval a stop signal cuts short
    (one process checks between batches; ranks cannot) sets `eval_due` and saves last.pt."""
    state, dist = run.state, run.dist
    t_pause = clock.now()
    losses, improved = None, False
    if eval_now:
        try:
            losses = evaluate(run.eval_model, run.task, run.device, run.dtype, dist,
                              run.eval_group, stop=None if dist.active else stop.requested)
            state.elapsed_s = clock.elapsed()
            improved = losses["val"] < state.best_val
            state.best_val = min(state.best_val, losses["val"])
        except EvalStopped:
            save_now = True
        state.eval_due = losses is None
    # Rank 0 alone writes; should that fail (a full disk), `main_first` ends the others quietly.
    t_write = clock.now()
    with dist.main_first():
        if dist.is_main:
            if event is not None:
                log.log("train", **event)
            if losses is not None:
                log_eval(run, log, losses, lr, improved, stop.requested)
            if save_now or improved:
                save(run, clock, improved, save_now)
    clock.pause(t_pause, t_write - t_pause if eval_now else None,
                clock.now() - t_write if save_now else None)
    return losses


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


def save(run: Run, clock: Clock, best: bool, last: bool) -> None:
    """Write best.pt and / or last.pt (with the step's checkpoint train.keep_checkpoints keeps)."""
    run.state.elapsed_s = clock.elapsed()
    ckpt = {**{name: obj.state_dict() for name, obj in run.stateful().items()},
            "config": run.cfg.to_dict(), "vocab": run.task.vocab_state()}
    # best.pt first: a last.pt on disk never counts a best val whose best.pt a crash kept
    # from being written (a resume from the older last.pt evaluates that step again).
    if best:
        checkpoint.save(ckpt, run.run_dir / "best.pt")
    if last:
        checkpoint.save(ckpt, run.run_dir / "last.pt")
        keep = run.cfg.train.keep_checkpoints
        if keep:  # after last.pt: a crash in between loses no step a resume would redo
            path = checkpoint.step_path(run.run_dir, run.state.step)
            path.parent.mkdir(exist_ok=True)
            checkpoint.save(ckpt, path, run.run_dir)
            checkpoint.prune_steps(run.run_dir, keep)


def log_eval(run: Run, log: MetricsLogger, losses: dict[str, float], lr: float,
             improved: bool, stop: Callable[[], bool]) -> None:
    """An eval's event, its line and, if asked, a sample, cut short once stop() says so."""
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

