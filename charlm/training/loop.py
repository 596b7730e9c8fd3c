"""Training: `train(cfg)` and its loop (each step `charlm.training.optimizer.train_step` at the
rate of its schedule, `lr_at`), with the time budget and the CPU threads it follows.

`charlm.training.run_objects.build_run` builds a run's objects once into a `Run`; a resume then
loads the map of stateful objects (`Run.stateful`) from `last.pt`, the map every checkpoint saves.
`step` counts completed optimizer updates, skipped ones included: a step whose loss or gradient
norm is not finite skips its update. SIGINT / SIGTERM finish the current step, save `last.pt` and
raise `Interrupted` (see `charlm.training.faults`); an eval they cut short runs first on resume.

Under torchrun the same loop runs on every rank with DistributedDataParallel (see
`charlm.runtime.distributed.distributed`): each rank trains on its rows of the global batch that the
identically seeded sampler draws, so a step sees the batch a single-process run would; rank 0
alone logs, samples and writes. Every value that decides what the loop does next is the same on
all ranks: the loss (all-reduced), the gradient norm (of all-reduced gradients), hence `ok`, and
the stop signal, which one small host-side all-reduce per step agrees on. At log, eval and
checkpoint steps one more tells the other ranks that rank 0's writes went through, so a rank 0
that fails there (a full disk) does not leave them to die in a collective.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch

from charlm.config.schema import RunConfig
from charlm.core.durations import format_duration
from charlm.core.errors import CharlmError
from charlm.runtime.device import resolve_device, seed_everything
from charlm.runtime.distributed import Dist, distributed
from charlm.runtime.precision import resolve_dtype
from charlm.runtime.threads import CpuUse, Threads
from charlm.training import checkpoint
from charlm.training.budget import Budget, too_short
from charlm.training.faults import Interrupted, StopSignals
from charlm.training.metrics import MetricsLogger
from charlm.training.optimizer import lr_at, set_lr, train_step
from charlm.training.parent import Parent
from charlm.training.records import log_final, report_skipped, train_event, write
from charlm.training.resume import require_steps_left
from charlm.training.run_dir import check_run_dir, run_lock
from charlm.training.run_objects import (
    Clock,
    Run,
    RunFiles,
    TrainState,
    build_run,
    warn_short_warmup,
    wrap_model,
)
from charlm.training.validation import EvalStopped, evaluate


def train(cfg: RunConfig, resume: bool = False, overwrite: bool = False,
          progress: bool | None = None, now: Callable[[], float] = time.perf_counter,
          parent: Parent | None = None, size: Collection[str] | None = None) -> TrainState:
    """Train (or resume) the run described by `cfg` in `cfg.train.out_dir`; under torchrun,
    this rank's part of a DDP run. `now`: the clock the run's time is read from (a test's);
    `parent`: the model a fresh fine-tune (train.init_from) starts from; `size`: the keys the
    user set, when a fresh run's GPT is to be sized to its train.max_time
    (`charlm.training.sizing`; None: the config's model)."""
    with (distributed(resolve_device(cfg.train.device)) as (dist, device),
          run_lock(Path(cfg.train.out_dir), dist.is_main)):
        return _train(cfg, dist, device, resume, overwrite, progress, now, parent, size)


def _train(cfg: RunConfig, dist: Dist, device: torch.device, resume: bool, overwrite: bool,
           progress: bool | None, now: Callable[[], float] = time.perf_counter,
           parent: Parent | None = None, size: Collection[str] | None = None) -> TrainState:
    clock = Clock(start=now(), before=0.0, now=now)
    cpu_use = CpuUse()  # the load over the build, for the threads' first look
    tc = cfg.train
    run_dir = Path(tc.out_dir)
    dtype = resolve_dtype(tc.dtype, device)
    if tc.batch_size % dist.world_size:
        raise CharlmError(
            f"train.batch_size {tc.batch_size} does not split over {dist.world_size} processes; "
            "make it a multiple of the number of processes (nproc_per_node x nnodes)"
        )
    check_run_dir(run_dir, resume, overwrite)
    seed_everything(tc.seed)
    # Every rank loads the same last.pt, onto the CPU: torch sets RNG states only from CPU
    # tensors, and the model's and the optimizer's load_state_dict move theirs to the device.
    ckpt = checkpoint.load(run_dir / "last.pt") if resume else None
    if ckpt is not None:
        require_steps_left(cfg, ckpt, run_dir / "last.pt")
    run = build_run(cfg, dist, device, dtype, ckpt, parent, None if resume else size)
    cfg, tc = run.cfg, run.cfg.train  # a model sized to the budget changes the config
    if ckpt is not None:
        checkpoint.restore(ckpt, run.stateful(), run_dir / "last.pt")
    wrap_model(run)
    threads = Threads.start(tc.threads, device, clock.now(), cpu_use)
    clock.before = run.state.elapsed_s
    budget = make_budget(run)
    planned = budget is None or budget.plan is not None
    # A fresh run writes nothing (and --overwrite removes nothing) until its first step has run.
    files = RunFiles(run, overwrite, (tc.max_iters if budget is None else budget.steps)
                     if planned else None, run.state.step, progress)
    stop = StopSignals(announce=dist.is_main, saved=ckpt is not None)
    try:
        if ckpt is not None:
            files.open()
        if budget is not None and budget.plan is not None:  # a resumed plan goes on
            files.open().plan(budget.plan.steps, clock.start + tc.max_time - clock.before,
                              clock.now)
        with stop:
            final = _loop(run, files, stop, clock, saved_step=run.state.step if resume else None,
                          budget=budget, threads=threads)
        if final is not None:
            with dist.main_first():
                log_final(run, files.open(), final)
    finally:
        files.close()
    return run.state


def _loop(run: Run, files: RunFiles, stop: StopSignals, clock: Clock,
          saved_step: int | None, budget: Budget | None, threads: Threads,
          ) -> dict[str, float] | None:
    """Train to the last step (train.max_iters, or the one a time budget plans): set lr,
    train_step, maybe log, maybe evaluate, maybe save. Returns the losses of the latest eval.
    `files`: opened after the first step, if not before. `saved_step`: the step of the last.pt
    on disk, if any. `budget`: the run's time budget, which plans the steps as it goes.
    `threads`: the CPU threads, which follow the load."""
    cfg, state, dist = run.cfg, run.state, run.dist
    final: dict[str, float] | None = None
    run.model.train()
    clock.t_log = clock.now()
    last = cfg.train.max_iters if budget is None else budget.steps
    if state.eval_due:  # a stop signal cut this step's eval short before the resume: run it now
        final, _, _ = record(run, files.open(), stop, clock, None,
                             lr_at(state.step - 1, cfg.optim, last, budget), True, True)
        if (signum := dist.agree_signal(stop.signum)) is not None:
            raise interrupted(run, signum)  # last.pt saved, the eval due if cut short again
    while state.step < last:
        lr = lr_at(state.step, cfg.optim, last, budget)
        set_lr(run.optimizer, lr, cfg.optim)
        drawn = run.sampler.tokens
        loss, norm, ok = train_step(run.step_model, run.optimizer, run.scaler, run.sampler, cfg,
                                    run.device, run.dtype, dist)
        state.step += 1
        state.tokens += run.sampler.tokens - drawn
        clock.tokens += run.sampler.tokens - drawn
        state.bad.record(ok, state.step, cfg.train.max_bad_steps)
        log = open_files(files, clock)  # a fresh run's, once its first step has run
        log.advance()
        if (change := threads.check(clock.now())) is not None and run.dist.is_main:
            if change.startswith("warning:"):
                print(change, file=sys.stderr)
            else:
                log.message(f"step {state.step}: {change}")
        signum = dist.agree_signal(stop.signum)
        timed = budget is not None and follow(run, budget, clock, log)
        last = cfg.train.max_iters if budget is None else budget.steps
        log_now, eval_now, save_now = due(cfg, state.step, last, signum is not None, timed)
        if not (log_now or eval_now or save_now):
            continue  # the only steps that wait for the device are those below
        report_skipped(run, log, saved_step)
        event = train_event(run, loss, norm, lr, clock) if log_now else None
        losses, eval_s, save_s = record(run, log, stop, clock, event, lr, eval_now, save_now)
        final = final if losses is None else losses
        if state.eval_due:  # cut short by a stop signal: last.pt is saved, the run stops
            signum, save_now, timed = stop.signum, True, False
        saved_step = state.step if save_now else saved_step
        stop.saved = saved_step is not None
        if budget is not None:
            budget.measured(eval_s if eval_now else None, save_s if save_now else None)
            state.budget = budget.state()
        if timed:
            assert budget is not None
            last = first_plan(run, budget, log, clock, eval_s, save_s)
        if signum is not None and (state.step < last or state.eval_due):  # last.pt saved
            raise interrupted(run, signum)
    return final


def follow(run: Run, budget: Budget, clock: Clock, log: MetricsLogger) -> bool:
    """A time budget's part of a step just done: before its first plan, whether this step ends
    the timing (it then evaluates and saves, and `first_plan` follows); after it, the plan
    follows the clock (`Budget.follow`), and what changed goes to the log."""
    now = clock.now()
    if budget.plan is None or budget.timer is not None:
        return budget.timed(run.state.step, now, clock.paused)
    budget.follow(run.state.step, now, clock.paused, clock.elapsed(now), run.dist.least)
    for change in budget.changes:
        log.plan(budget.plan.steps, clock.start + budget.seconds - clock.before, clock.now)
        log.message(f"step {run.state.step}: time budget {format_duration(budget.seconds)}, "
                    f"{format_duration(clock.elapsed(now))} gone: {change}")
    run.state.budget = budget.state()
    return False


def record(run: Run, log: MetricsLogger, stop: StopSignals, clock: Clock,
           event: dict[str, Any] | None, lr: float, eval_now: bool, save_now: bool,
           ) -> tuple[dict[str, float] | None, float, float]:
    """The log event, eval and checkpoints of the step just done (rank 0 writes), paused out
    of the training time. Returns the eval's losses (None: no eval) and the seconds the eval
    and the writes took. An eval a stop signal cuts short (one process checks between
    batches; ranks cannot) leaves `eval_due` set and saves last.pt, for a resume to run it."""
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
    # Rank 0 alone writes: should that fail (a full disk), the others hear it and end
    # quietly, instead of in their next collective with a traceback.
    t_write = clock.now()
    with dist.main_first():
        if dist.is_main:
            write(run, log, event, losses, lr, improved, save_now, clock, stop.requested)
    now = clock.pause(t_pause)  # out of the training time, for tokens/s and the budget
    return losses, t_write - t_pause, now - t_write


def open_files(files: RunFiles, clock: Clock) -> MetricsLogger:
    """The run's log, its files opened (and for --overwrite the previous run's removed) at the
    first call; that time is not training time, for tokens/s."""
    if files.log is None:
        t_open = clock.now()
        files.open()
        clock.t_log += clock.now() - t_open
    return files.open()


def make_budget(run: Run) -> Budget | None:
    """The run's time budget, continuing the plan of the checkpoint resumed from (None: no
    budget; one dropped on resume leaves max_iters in charge, and a later one plans afresh)."""
    tc, state = run.cfg.train, run.state
    if tc.max_time is None:
        state.budget = None
        return None
    return Budget.resume(tc.max_time, tc.eval_interval, tc.checkpoint_interval or
                         tc.eval_interval, run.cfg.optim.warmup_iters, state.budget)


def first_plan(run: Run, budget: Budget, log: MetricsLogger, clock: Clock, eval_s: float,
               save_s: float) -> int:
    """Plan the steps from the step, eval and save times just measured so that the run ends
    within train.max_time, and save the plan in last.pt; the planned last step. All ranks take
    the smallest."""
    state, dist = run.state, run.dist
    spent = clock.elapsed() + save_s / 2  # and the last.pt written again below
    left = budget.first_plan(state.step, spent, eval_s, save_s, dist.least)
    step_s = budget.plan.step_s
    if left < 0:  # not even a final evaluation fits: the one just made and saved ends the run
        budget.plan.steps = state.step
    state.budget = budget.state()
    log.plan(budget.plan.steps, clock.start + budget.seconds - clock.before, clock.now)
    log.message(too_short(budget.seconds, spent, state.step, step_s, eval_s, save_s) if left < 0
                else f"time budget {format_duration(budget.seconds)}: {budget.plan.steps} steps "
                f"({step_s * 1000:.0f} ms a step, {format_duration(eval_s + save_s)} an eval "
                "with its checkpoints)")
    if left >= 0:
        warn_short_warmup(run.cfg, dist, budget.plan.steps)
    t_write = clock.now()
    with dist.main_first():
        if dist.is_main:
            write(run, log, train_event=None, losses=None, lr=0.0, improved=False,
                  save_last=True, clock=clock)  # last.pt again, now with its plan
    clock.pause(t_write)  # not a step's time: the pace would take it for a slower machine
    return budget.plan.steps


def due(cfg: RunConfig, step: int, last_step: float, stopping: bool,
        timed: bool = False) -> tuple[bool, bool, bool]:
    """Whether step `step` (just done) logs, evaluates and saves last.pt. The last step does all
    three, as does the step a time budget's timer ends on; a stop signal saves."""
    tc = cfg.train
    last = step == last_step or timed
    save_interval = tc.checkpoint_interval or tc.eval_interval  # null: last.pt at every eval
    return (step % tc.log_interval == 0 or last, step % tc.eval_interval == 0 or last,
            step % save_interval == 0 or last or stopping)


def interrupted(run: Run, signum: int) -> Interrupted:
    """The stop after a signal, once last.pt is saved (under torchrun main_first waited)."""
    return Interrupted(
        f"interrupted by {signal.Signals(signum).name} at step {run.state.step}: saved "
        f"{run.run_dir / 'last.pt'}; continue with "
        f"`charlm train --out {shlex.quote(str(run.run_dir))} --resume`", signum)
