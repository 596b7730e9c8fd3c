"""When things happen in a run: `Schedule` gives a step's learning rate (linear warmup, then
`optim.schedule`: `wsd`, which Hägele et al. 2024 and Bergsma et al. 2025 find at least matching
`cosine`) and whether the step logs, evaluates, saves and is the last; `Clock` keeps the run's
time, the one place that reads it (docs/design.md, "The time budget")."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from charlm.config.optim import OptimConfig
from charlm.config.schema import TrainConfig


@dataclass
class Schedule:
    optim: OptimConfig
    train: TrainConfig
    reached: float = 0.0  # a time budget's progress so far: it never goes back as the reserve falls

    def lr(self, step: int, elapsed: float = 0.0, reserve: float = 0.0) -> float:
        """The learning rate of step `step` (0-based), which peaks at `optim.lr`. The decay runs
        by steps from the end of warmup to `lr_decay_iters` (null: max_iters), so a run and its
        resume repeat bitwise, or for a time budget by `elapsed` seconds over the budget less
        `reserve` (one step and `Clock.final_s`)."""
        o, t = self.optim, self.train
        if step < o.warmup_iters:
            return o.lr * (step + 1) / (o.warmup_iters + 1)
        if t.max_time is not None and o.lr_decay_iters is None:
            share = elapsed / max(t.max_time - reserve, 1e-9)
            self.reached = p = max(self.reached, min(share, 1.0))
        else:
            end = o.lr_decay_iters or t.max_iters
            p = min(max(step - o.warmup_iters, 0) / max(end - o.warmup_iters, 1), 1.0)
        if o.schedule == "cosine":
            share = 0.5 * (1.0 + math.cos(math.pi * p))
        else:
            share = min(1.0, (1.0 - p) / o.decay_frac)
        return o.min_lr + share * (o.lr - o.min_lr)

    def is_last(self, step: int, elapsed: float = 0.0, step_s: float = 0.0,
                final_s: float = 0.0) -> bool:
        """Whether step `step` (just done) ends the run: max_iters, or for a time budget the
        step after which one more step of `step_s` and the final evaluation with its writes
        (`final_s`) would not fit, after this step's own evaluation where one is due."""
        t = self.train
        if t.max_time is None:
            return step >= t.max_iters
        evals = 2 if step % t.eval_interval == 0 else 1
        return elapsed + step_s + evals * final_s >= t.max_time

    def due(self, step: int, last: bool, stopping: bool) -> tuple[bool, bool, bool]:
        """Whether step `step` (just done) logs, evaluates and saves last.pt: each at its
        interval, all three at the last step; a stop signal saves."""
        t = self.train
        save_interval = t.checkpoint_interval or t.eval_interval  # null: at every eval
        return (step % t.log_interval == 0 or last, step % t.eval_interval == 0 or last,
                step % save_interval == 0 or last or stopping)


@dataclass
class Clock:
    """The run's time, with pauses for evals and writes kept out of the step times and tokens/s."""

    start: float  # now() when train() began
    before: float = 0.0  # elapsed_s of the checkpoint resumed from
    now: Callable[[], float] = time.perf_counter
    eval_steps: float = 20.0  # an evaluation's cost in steps (until measured: eval_iters)
    save_s: float = 0.0  # the seconds of the latest checkpoint writes
    step_s: float = 0.0  # the latest step's seconds
    t_step: float | None = None  # when the latest step (or pause) ended
    t_log: float = 0.0
    tokens: int = 0  # training tokens since the last log line

    def elapsed(self, now: float | None = None) -> float:
        return self.before + (self.now() if now is None else now) - self.start

    def stepped(self, tokens: int) -> None:
        now = self.now()
        if self.t_step is not None:
            self.step_s = now - self.t_step
        self.t_step, self.tokens = now, self.tokens + tokens

    def pause(self, since: float, eval_s: float | None = None, save_s: float | None = None
              ) -> None:
        """Count the time from `since` to now as paused; `eval_s`, `save_s`: `final_s`'s costs."""
        now = self.now()
        self.t_log += now - since
        self.t_step = now if self.t_step is None else self.t_step + now - since
        if eval_s is not None and self.step_s > 0:
            self.eval_steps = eval_s / self.step_s
        if save_s is not None:
            self.save_s = save_s

    def final_s(self) -> float:
        """Seconds of an eval and its writes at the latest step's pace (evals slow as steps do)."""
        return self.step_s * self.eval_steps + self.save_s
