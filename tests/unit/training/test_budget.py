"""charlm.training.budget: the plan's arithmetic, and `Budget` following a clock (a run's loop
driven here by hand: `drive`)."""

import math

import pytest

from charlm.training import budget
from charlm.training.budget import Budget, plan_steps


def test_plan_counts_steps_evals_and_saves():
    # 0.1 s a step plus 3 s of eval and saves every 50 steps: 0.16 s a step; the final eval
    # and saves (3 s) come off the seconds first.
    assert plan_steps(97, 0.1, 2.0, 1.0, 50, 50) == math.floor((97 - 3) / 0.16)
    # last.pt alone every 10 steps as well: half the save time, 4 more times per eval.
    assert plan_steps(97, 0.1, 2.0, 1.0, 50, 10) == math.floor((97 - 3) / 0.2)
    assert plan_steps(2, 0.1, 2.0, 1.0, 50, 50) < 0


def drive(seconds: float, step_s, eval_steps: float = 2.0, every: int = 10,
          least=lambda n: n) -> tuple[Budget, float, list[str]]:
    """A run's loop around a Budget on a clock where a step takes step_s(t) seconds and an
    evaluation `eval_steps` steps' worth (every `every` steps, the last one and the timed one):
    the budget, the time it ended at and the changes it made."""
    b = Budget.resume(seconds, every, every, warmup=0, saved=None)
    t = paused = 0.0
    step, changes = 0, []
    while step < b.steps:
        t += step_s(t)
        step += 1
        timed = False
        if b.plan is None:
            timed = b.timed(step, t, paused)
        else:
            b.follow(step, t, paused, t, least)
            changes += b.changes
        if step % every == 0 or step == b.steps or timed:
            spent = eval_steps * step_s(t)
            t, paused = t + spent, paused + spent
            b.measured(spent, 0.0)
            if timed:
                assert b.first_plan(step, t, spent, 0.0, least) >= 0
    return b, t, changes


def test_a_steady_machine_keeps_its_first_plan():
    # timed to step 6, 8 s gone with its evaluation: 6 + (97 - 8 - 2) / 1.2 steps
    b, end, changes = drive(100, lambda t: 1.0)
    assert changes == [] and b.plan.steps == 6 + 72 and 94 <= end <= 97


@pytest.mark.parametrize("slower_from", [20, 50, 80])
def test_a_machine_ten_times_slower_midway_ends_within_the_budget(slower_from):
    """Within 10 s of it: a step begun at 1 s a step that takes 10, and then the final
    evaluation at 20 s instead of 2, is the most it can overrun by."""
    b, end, changes = drive(100, lambda t: 1.0 if t < slower_from else 10.0)
    assert end <= 100 + 10 and changes and b.plan.steps < 78


def test_a_faster_machine_plans_more_steps_and_uses_the_time():
    b, end, changes = drive(100, lambda t: 1.0 if t < 30 else 0.25)
    assert 94 <= end <= 100 and b.plan.steps > 200 and changes


def test_the_schedule_keeps_its_progress_when_the_plan_changes():
    b = Budget.resume(100, 10, 10, warmup=5, saved={
        "steps": 45, "anchor_step": 5, "anchor_progress": 0.0, "step_s": 1.0,
        "eval_steps": 2.0, "save_s": 0.0})
    assert [b.progress(s) for s in (0, 5, 25, 45, 60)] == [0.0, 0.0, 0.5, 1.0, 1.0]
    # at step 25, 60 s gone at 1 s a step: 100 s could not hold 20 steps more, their
    # evaluations and the final one (20 * 1.2 + 2 = 26 s): planned again, from progress 0.5
    b.last = (59.0, 0.0)
    b.follow(25, 60.0, 0.0, 60.0)
    assert b.plan.steps == 25 + math.floor((97 - 60 - 2) / 1.2)
    assert (b.plan.anchor_step, b.plan.anchor_progress) == (25, 0.5)
    assert b.progress(25) == 0.5 and b.progress(b.plan.steps) == 1.0
    assert b.changes == [f"{b.plan.steps} steps at 1000 ms a step (planned 45)"]


def test_the_ranks_take_the_fewest_steps_left():
    b = Budget.resume(100, 10, 10, warmup=0, saved=None)
    for step in range(1, 7):
        timed = b.timed(step, float(step), 0.0)
    assert timed and b.first_plan(6, 8.0, 2.0, 0.0, least=lambda n: 3) == 3
    assert b.plan.steps == 9
    b.follow(7, 7.0, 0.0, 9.0, least=lambda n: 0)  # another rank ends now
    assert b.plan.steps == 7 and b.changes == ["ends now at 1000 ms a step (planned 9)"]


def test_the_pace_averages_over_a_share_of_the_budget(monkeypatch):
    monkeypatch.setattr(budget, "PACE_MIN_S", 0.0)
    b = Budget.resume(1000, 10, 10, warmup=0, saved={
        "steps": 500, "anchor_step": 0, "anchor_progress": 0.0, "step_s": 1.0,
        "eval_steps": 0.0, "save_s": 0.0})
    b.last = (0.0, 0.0)
    b.follow(1, 3.0, 1.0, 3.0)  # 2 s busy (1 s paused): weighs 2 / (1 % of 1000 s)
    assert b.plan.step_s == pytest.approx(1.0 + 0.2 * (2.0 - 1.0))
