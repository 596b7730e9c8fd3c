"""charlm.training.schedule: the learning rate and the due steps of a run by steps and of one
by a time budget, and the `Clock` a budget's end is reckoned on (a machine that slows down
midway, driven here by hand: `drive`)."""

import pytest

from charlm.config.optim import OptimConfig
from charlm.config.schema import TrainConfig
from charlm.training.schedule import Clock, Schedule


def schedule(optim=None, **train) -> Schedule:
    return Schedule(OptimConfig(**(optim or {})), TrainConfig(**train))


def test_cosine_by_steps_warms_up_then_decays_to_min_lr():
    s = schedule({"lr": 1e-3, "min_lr": 1e-4, "warmup_iters": 10, "lr_decay_iters": 110,
                  "schedule": "cosine"}, max_iters=500)
    assert s.lr(0) == pytest.approx(1e-3 * 1 / 11)
    assert s.lr(9) == pytest.approx(1e-3 * 10 / 11)
    assert s.lr(10) == pytest.approx(1e-3)  # the decay starts at the peak
    assert s.lr(60) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))  # halfway
    assert s.lr(110) == pytest.approx(1e-4) and s.lr(400) == pytest.approx(1e-4)
    s = schedule({"lr": 1e-3, "min_lr": 0.0, "warmup_iters": 0, "schedule": "cosine"},
                 max_iters=100)  # lr_decay_iters null: max_iters
    assert s.lr(50) == pytest.approx(0.5e-3) and s.lr(100) == 0.0


def test_wsd_by_steps_holds_the_peak_then_decays_linearly_over_its_share():
    s = schedule({"lr": 1e-3, "min_lr": 1e-4, "warmup_iters": 10, "decay_frac": 0.25},
                 max_iters=110)
    assert s.lr(0) == pytest.approx(1e-3 / 11)
    assert [s.lr(step) for step in (10, 50, 85)] == [1e-3] * 3  # stable to 75 % of the way
    assert s.lr(97.5) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert s.lr(110) == pytest.approx(1e-4)
    lrs = [s.lr(step) for step in range(10, 111)]
    assert lrs == sorted(lrs, reverse=True)
    # by steps, the elapsed time changes nothing: a run and its resume repeat bitwise
    assert s.lr(100, elapsed=1e6, reserve=5.0) == s.lr(100)


def test_a_time_budget_runs_the_decay_along_the_time_left_for_training():
    s = schedule({"lr": 1e-3, "min_lr": 0.0, "warmup_iters": 5, "decay_frac": 0.2},
                 max_time=100.0)
    assert s.lr(2, elapsed=50.0) == pytest.approx(1e-3 * 3 / 6)  # warmup counts steps
    # 10 s kept for one more step and the final eval: training has 90 s, decaying from 72 s
    assert s.lr(100, elapsed=72.0, reserve=10.0) == pytest.approx(1e-3)
    assert s.lr(100, elapsed=81.0, reserve=10.0) == pytest.approx(0.5e-3)
    assert s.lr(100, elapsed=95.0, reserve=10.0) == 0.0
    assert not s.is_last(101, elapsed=89.9, step_s=2.0, final_s=8.0)
    assert s.is_last(101, elapsed=90.0, step_s=2.0, final_s=8.0)
    # an evaluation due at this step (eval_interval 250) comes before the next step and the last
    assert s.is_last(250, elapsed=82.0, step_s=2.0, final_s=8.0)
    assert not s.is_last(250, elapsed=81.9, step_s=2.0, final_s=8.0)


def test_due_steps_log_evaluate_and_save_at_their_intervals_and_all_at_the_last():
    s = schedule(max_iters=100, log_interval=10, eval_interval=25, checkpoint_interval=5)
    assert s.due(10, False, False) == (True, False, True)
    assert s.due(25, False, False) == (False, True, True)
    assert s.due(7, False, False) == (False, False, False)
    assert s.due(7, False, True) == (False, False, True)  # a stop signal saves
    assert s.due(7, True, False) == (True, True, True)
    assert s.is_last(100) and not s.is_last(99)
    assert schedule(eval_interval=25).due(50, False, False) == (True, True, True)  # null: evals


class Machine:
    """A clock on which a step takes step_s(t) seconds and an evaluation `eval_steps` steps."""

    def __init__(self, step_s, eval_steps=2.0):
        self.t, self.step_s, self.eval_steps = 0.0, step_s, eval_steps

    def now(self) -> float:
        return self.t


def drive(machine: Machine, seconds: float, every: int = 10):
    """A run's loop around a Schedule and a Clock: its steps, the time it ended at, and the
    learning rates of its steps."""
    s = schedule({"warmup_iters": 0, "min_lr": 0.0}, max_time=seconds, eval_interval=every)
    clock = Clock(start=0.0, now=machine.now, eval_steps=20.0)
    clock.t_step = 0.0
    step, elapsed, step_s, final_s, lrs = 0, 0.0, 0.0, clock.final_s(), []
    while True:
        lrs.append(s.lr(step, elapsed, step_s + final_s))
        machine.t += machine.step_s(machine.t)
        step += 1
        clock.stepped(1)
        elapsed, step_s, final_s = clock.elapsed(), clock.step_s, clock.final_s()
        last = s.is_last(step, elapsed, step_s, final_s)
        if s.due(step, last, False)[1]:
            since = machine.t
            machine.t += machine.eval_steps * machine.step_s(machine.t)
            clock.pause(since, machine.t - since, 0.0)
        if last:
            return step, machine.t, lrs


def test_a_steady_machine_ends_within_its_budget_with_the_rate_decayed():
    steps, end, lrs = drive(Machine(lambda t: 0.1), 100.0)
    assert 99.0 <= end <= 100.0 and steps >= 800
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < 0.01 * lrs[0]


@pytest.mark.parametrize("slower_from", [20, 50, 80])
def test_a_machine_ten_times_slower_midway_still_ends_within_the_budget(slower_from):
    """The reserve counts the final evaluation in steps at the latest step's pace: 10 s a
    step from `slower_from` on makes it 20 s, and the run ends before it no longer fits. The
    one step that begins at 1 s a step and takes 10 is the most it can overrun by."""
    steps, end, lrs = drive(Machine(lambda t: 1.0 if t < slower_from else 10.0), 100.0)
    assert end <= 100.0 + 10.0 and lrs == sorted(lrs, reverse=True)


def test_a_machine_that_speeds_up_uses_the_time():
    steps, end, _ = drive(Machine(lambda t: 1.0 if t < 30 else 0.25), 100.0)
    assert 98.0 <= end <= 100.0 and steps > 250


def test_the_clock_pauses_evals_and_writes_out_of_the_step_time():
    t = [0.0]
    clock = Clock(start=0.0, before=30.0, now=lambda: t[0])
    clock.t_step = 0.0
    t[0] = 2.0
    clock.stepped(100)
    t[0] = 5.0
    clock.pause(2.0, 2.0, 1.0)  # a 2 s eval and 1 s of writes
    t[0] = 7.0
    clock.stepped(100)
    assert clock.step_s == 2.0 and clock.t_log == 3.0 and clock.tokens == 200
    assert clock.eval_steps == 1.0 and clock.save_s == 1.0
    assert clock.final_s() == 2.0 * 1.0 + 1.0
    assert clock.elapsed() == 37.0  # the resumed run's 30 s count
