"""A run's time budget (`train.max_time`, `charlm train --time 5m`): the step timer and the
plan that turns seconds into a number of steps (durations are `charlm.core.durations`).

A budgeted run times its first steps, then one evaluation and its checkpoint writes, and fixes
the number of steps that lets the rest of the run, its evaluations and its final checkpoint end
within the budget. That number becomes `train.max_iters` (saved in the checkpoint and
config.yaml), so warmup and the cosine decay are laid out over it and `--resume` continues the
same schedule. Until it is fixed, steps past warmup run at the peak learning rate (the cosine
has not begun).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from charlm.core.durations import format_duration
from charlm.core.errors import CharlmError

MIN_TIMED_STEPS = 3  # after the first step, whose time holds one-off costs (allocation, compile)


TIMING_SHARE, TIMING_MAX_S = 0.05, 10.0  # time the steps for 5 % of the budget, at most 10 s


MARGIN = 0.97  # of the remaining time planned for: step times vary


@dataclass
class StepTimer:
    """Times training steps from the end of the first one, leaving out the evals and saves
    (`paused`, the loop's running total of them); `step_s` once enough are timed."""

    seconds: float  # the budget
    start_step: int | None = None
    start_time: float = 0.0
    start_paused: float = 0.0
    step_s: float = math.nan

    def done(self, step: int, now: float, paused: float) -> bool:
        """Record the end of step `step`; whether enough steps are timed to plan."""
        if self.start_step is None:
            self.start_step, self.start_time, self.start_paused = step, now, paused
            return False
        busy = now - self.start_time - (paused - self.start_paused)
        timed = step - self.start_step
        if timed < MIN_TIMED_STEPS or busy < min(TIMING_SHARE * self.seconds, TIMING_MAX_S):
            return False
        self.step_s = busy / timed
        return True


def plan_steps(remaining: float, step_s: float, eval_s: float, save_s: float,
               eval_interval: int, save_interval: int) -> int:
    """How many more steps fit in `remaining` seconds: each costs `step_s`, every
    `eval_interval`-th an evaluation `eval_s` plus its checkpoint writes `save_s` (last.pt and
    best.pt), every `save_interval`-th between them half of `save_s` (last.pt alone), and the
    final step an evaluation and writes. Negative when not even that final one fits."""
    extra_saves = max(0.0, 1 / save_interval - 1 / eval_interval)
    per_step = step_s + (eval_s + save_s) / eval_interval + extra_saves * save_s / 2
    return math.floor((MARGIN * remaining - eval_s - save_s) / per_step)


def too_short(seconds: float, spent: float, steps: int, step_s: float, eval_s: float,
              save_s: float) -> CharlmError:
    """The error for a budget that the first steps, one evaluation and a checkpoint used up."""
    need = spent + eval_s + save_s + 10 * step_s
    return CharlmError(
        f"train.max_time={format_duration(seconds)} is too short for this run here: "
        f"{format_duration(spent)} went to starting, {steps} timed steps "
        f"({step_s * 1000:.0f} ms each) and an evaluation with its checkpoint "
        f"({format_duration(eval_s + save_s)}), which leaves no time for the final "
        f"evaluation; give at least {format_duration(math.ceil(need))} "
        "(or set train.max_iters without a budget)")


def require_same_budget(max_time: float | None, max_iters: int | None,
                        saved_time: float | None, budget_steps: int | None) -> None:
    """A resume keeps the steps its time budget fixed (`budget_steps`; the schedule is laid over
    them): refuse a train.max_time other than the one that fixed them (`saved_time`), or a
    train.max_iters the user set to other steps (None: none set), either of which would not
    apply."""
    if budget_steps is None or max_time is None or saved_time is None:
        return  # no steps fixed, or the budget is dropped (max_iters rules)
    if max_time != saved_time:
        key = f"train.max_time={format_duration(max_time)}"
    elif max_iters is not None and max_iters != budget_steps:
        key = f"train.max_iters={max_iters}"
    else:
        return
    raise CharlmError(
        f"--resume: {key} cannot apply: the run's time budget train.max_time="
        f"{format_duration(saved_time)} fixed its steps at {budget_steps}, its schedule laid "
        "over them; to train to another step, resume with --set train.max_time=null --set "
        "train.max_iters=N")
