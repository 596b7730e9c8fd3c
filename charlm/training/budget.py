"""A run's time budget (`train.max_time`, `charlm train --time 5m`): `Budget`, the plan of the
steps that fit it, which follows the clock as the machine's speed changes (durations are
`charlm.core.durations`).

First plan. The budget times its first steps (`StepTimer`; evaluations and saves are paused out),
then one evaluation and its checkpoint writes, and plans the steps that let the rest of the run,
its evaluations and its final checkpoint end by MARGIN of the budget (`plan_steps`). Until then,
steps past warmup run at the peak learning rate.

Following the clock. After every step the budget updates its pace: the step time, a moving
average over about PACE_SHARE of the budget, and each evaluation's cost counted in steps (an
evaluation is as much slower as the steps are). When the run at that pace would end past the
budget, or before LOW of it, it plans again from here, and when the final evaluation and
checkpoint would no longer fit after one more step, this step is the last. On a machine whose
speed holds, the first plan stands to the end.

Schedule. The cosine decay runs along `progress`, 0 to 1, laid linearly over the planned steps
from an anchor (a step and the progress there): the end of warmup at first, then the step of
each new plan, which keeps the progress reached and spreads the rest over the new steps left, so
the learning rate never jumps. The plan and the pace are saved in each checkpoint
(`TrainState.budget`), so `--resume` continues them; the config is never rewritten.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from charlm.core.durations import format_duration
from charlm.core.errors import CharlmError

MIN_TIMED_STEPS = 3  # after the first step, whose time holds one-off costs (allocation, compile)
TIMING_SHARE, TIMING_MAX_S = 0.05, 10.0  # time the steps for 5 % of the budget, at most 10 s
MARGIN = 0.97  # of the budget a plan ends by: step times vary
LOW = 0.94  # a run projected to end before this share of its budget plans again (more steps)
PACE_SHARE, PACE_MIN_S = 0.01, 1.0  # the step time averages over 1 % of the budget, >= 1 s
NOTE_SHARE = 0.1  # a new plan is told (`changes`) when it ends now or moves the end this much


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


@dataclass
class Plan:
    """What a checkpoint keeps of a budget: the planned last step, the anchor the schedule's
    progress runs from, and the pace (seconds a step, an evaluation's cost in steps, the
    seconds of a checkpoint's writes)."""

    steps: int
    anchor_step: int
    anchor_progress: float
    step_s: float
    eval_steps: float
    save_s: float


PLAN_KEYS = frozenset(f.name for f in fields(Plan))


@dataclass
class Budget:
    """A run's time budget: `seconds` from the run's first start (resumes included). Made by
    `Budget.resume`; the loop asks `timed` after each step until it makes the `first_plan`,
    then `follow` after each step."""

    seconds: float
    eval_interval: int
    save_interval: int
    warmup: int
    plan: Plan | None = None
    timer: StepTimer | None = None
    last: tuple[float, float] | None = None  # (now, paused) at the end of the step before
    changes: list[str] = field(default_factory=list)  # what the last `follow` did, for the log
    told: int | None = None  # the last step of the plan last told (NOTE_SHARE)

    @classmethod
    def resume(cls, seconds: float, eval_interval: int, save_interval: int, warmup: int,
               saved: dict | None) -> Budget:
        """The budget of a run, continuing the plan a checkpoint saved (`saved`), if any. A
        checkpoint from before the budget followed the clock saved the planned steps alone: the
        schedule then runs from the end of warmup, as it did, and the pace is timed again."""
        if saved is None:
            return cls(seconds, eval_interval, save_interval, warmup, None, StepTimer(seconds))
        if set(saved) == {"steps"}:
            plan = Plan(saved["steps"], warmup, 0.0, math.nan, math.nan, math.nan)
            return cls(seconds, eval_interval, save_interval, warmup, plan, StepTimer(seconds))
        return cls(seconds, eval_interval, save_interval, warmup, Plan(**saved))

    @property
    def steps(self) -> float:
        """The planned last step (inf until the first plan)."""
        return math.inf if self.plan is None else self.plan.steps

    def state(self) -> dict | None:
        """The plan for a checkpoint: None before the first, its steps alone before its pace is
        timed (a plan resumed from an older checkpoint)."""
        if self.plan is None:
            return None
        return {"steps": self.plan.steps} if self.timer is not None else asdict(self.plan)

    def progress(self, step: int) -> float:
        """How far along the decay step `step` is, in [0, 1] (0 until the first plan)."""
        p = self.plan
        if p is None or step <= p.anchor_step:
            return 0.0 if p is None else p.anchor_progress
        share = (step - p.anchor_step) / max(p.steps - p.anchor_step, 1)
        return min(p.anchor_progress + share * (1.0 - p.anchor_progress), 1.0)

    def timed(self, step: int, now: float, paused: float) -> bool:
        """Before the first plan: whether step `step` (just done) ends the timing."""
        self.last = (now, paused)
        return self.timer is not None and self.timer.done(step, now, paused)

    def first_plan(self, step: int, elapsed: float, eval_s: float, save_s: float,
                   least=lambda n: n) -> int:
        """The first plan, at step `step`, from the timed steps and the evaluation and writes
        just measured: its steps left (negative: not even the final evaluation fits).
        `least`: the smallest of the ranks' values (DDP). A plan resumed without its pace keeps
        its steps and takes this pace."""
        assert self.timer is not None
        step_s, self.timer = self.timer.step_s, None
        if self.plan is not None:
            self.plan.step_s, self.plan.eval_steps, self.plan.save_s = (
                float(step_s), float(eval_s / step_s), float(save_s))
            return self.plan.steps - step
        left = least(plan_steps(MARGIN * self.seconds - elapsed, step_s, eval_s, save_s,
                                self.eval_interval, self.save_interval))
        self.plan = Plan(step + left, self.warmup, 0.0, float(step_s), float(eval_s / step_s),
                         float(save_s))
        return left

    def measured(self, eval_s: float | None, save_s: float | None) -> None:
        """An evaluation and checkpoint writes just took eval_s and save_s (None: not done)."""
        p = self.plan
        if p is not None and self.timer is None:  # a plan being timed takes them at its end
            if eval_s is not None:
                p.eval_steps = float(eval_s / p.step_s)
            if save_s is not None:
                p.save_s = float(save_s)

    def follow(self, step: int, now: float, paused: float, elapsed: float,
               least=lambda n: n) -> None:
        """After step `step`: update the pace, and plan again, or end at this step, where the
        clock says so (see the module's docstring). `changes` says what it did."""
        p, self.changes = self.plan, []
        assert p is not None
        if self.last is not None:
            busy = now - self.last[0] - (paused - self.last[1])
            weight = min(busy / max(PACE_SHARE * self.seconds, PACE_MIN_S), 1.0)
            p.step_s += weight * (busy - p.step_s)
        self.last = (now, paused)
        final = p.eval_steps * p.step_s + p.save_s
        ends = elapsed + self.cost(p.steps - step) + final
        if elapsed + p.step_s + final > self.seconds:  # one more step would overrun
            left = 0
        elif LOW * self.seconds <= ends <= self.seconds:
            left = p.steps - step  # on course
        else:
            left = max(plan_steps(MARGIN * self.seconds - elapsed, p.step_s,
                                  p.eval_steps * p.step_s, p.save_s, self.eval_interval,
                                  self.save_interval), 0)
        left = least(left)
        if step + left == p.steps:
            return
        told = p.steps if self.told is None else self.told
        if left == 0 or abs(step + left - told) >= NOTE_SHARE * told:
            self.changes.append(f"{'ends now' if left == 0 else f'{step + left} steps'} at "
                                f"{p.step_s * 1000:.0f} ms a step (planned {told})")
            self.told = step + left
        p.anchor_progress, p.anchor_step = self.progress(step), step
        p.steps = step + left

    def cost(self, steps: int) -> float:
        """Seconds of `steps` more steps with their evaluations and saves, at the pace."""
        p = self.plan
        assert p is not None
        return steps * per_step(p.step_s, p.eval_steps * p.step_s, p.save_s,
                                self.eval_interval, self.save_interval)


def per_step(step_s: float, eval_s: float, save_s: float, eval_interval: int,
             save_interval: int) -> float:
    """Seconds a step costs with its share of the evaluations (`eval_s` with their checkpoint
    writes `save_s`, every eval_interval-th step) and of last.pt's writes alone (half of save_s,
    every save_interval-th between them)."""
    extra_saves = max(0.0, 1 / save_interval - 1 / eval_interval)
    return step_s + (eval_s + save_s) / eval_interval + extra_saves * save_s / 2


def plan_steps(left_s: float, step_s: float, eval_s: float, save_s: float,
               eval_interval: int, save_interval: int) -> int:
    """How many more steps fit in `left_s` seconds with their evaluations and saves
    (`per_step`), and the final step's evaluation and writes. Negative when not even that
    final one fits."""
    per = per_step(step_s, eval_s, save_s, eval_interval, save_interval)
    return math.floor((left_s - eval_s - save_s) / per)


def too_short(seconds: float, spent: float, steps: int, step_s: float, eval_s: float,
              save_s: float) -> str:
    """Why a run ends at its first evaluation: the first steps, that evaluation and its
    checkpoint used up the budget (what it saved is the run), and what budget trains further."""
    need = spent + eval_s + save_s + 10 * step_s
    return (f"time budget {format_duration(seconds)} used up: {format_duration(spent)} went to "
            f"starting, {steps} timed steps ({step_s * 1000:.0f} ms each) and an evaluation "
            f"with its checkpoints ({format_duration(eval_s + save_s)} of it), which leaves no "
            f"time for another; the run ends at step {steps} with what that evaluation saved "
            f"(best.pt, last.pt); give at least {format_duration(math.ceil(need))} to train "
            "further (or set train.max_iters without a budget)")


def require_same_budget(max_time: float | None, max_iters: int | None,
                        saved_time: float | None, saved_iters: int | None,
                        budget_steps: int | None) -> None:
    """A resume continues the plan of its time budget (`budget_steps`, the planned last step):
    refuse a train.max_time other than the one that planned it (`saved_time`), or a
    train.max_iters the user set (other than the saved config's `saved_iters`; None: none set),
    either of which would not apply."""
    if budget_steps is None or max_time is None or saved_time is None:
        return  # no steps planned, or the budget is dropped (max_iters rules)
    if max_time != saved_time:
        key = f"train.max_time={format_duration(max_time)}"
    elif max_iters is not None and max_iters != saved_iters:
        key = f"train.max_iters={max_iters}"
    else:
        return
    raise CharlmError(
        f"--resume: {key} cannot apply: the run's time budget train.max_time="
        f"{format_duration(saved_time)} planned its steps (to step {budget_steps}), its "
        "schedule laid over them; to train to another step, resume with --set "
        "train.max_time=null --set train.max_iters=N")
