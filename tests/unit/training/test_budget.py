"""charlm.training.budget: the plan's arithmetic."""

import math

from charlm.training.budget import plan_steps


def test_plan_counts_steps_evals_and_saves():
    # 0.1 s a step plus 3 s of eval and saves every 50 steps: 0.16 s a step; the final eval
    # and saves (3 s) come off the 97 % of 100 s first.
    assert plan_steps(100, 0.1, 2.0, 1.0, 50, 50) == math.floor((97 - 3) / 0.16)
    # last.pt alone every 10 steps as well: half the save time, 4 more times per eval.
    assert plan_steps(100, 0.1, 2.0, 1.0, 50, 10) == math.floor((97 - 3) / 0.2)
    assert plan_steps(2, 0.1, 2.0, 1.0, 50, 50) < 0
