"""charlm.training.faults: the bad-step counters, saved and loaded with the train state."""

import math
from pathlib import Path

import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.training.faults import BadSteps
from charlm.training.run_objects import TrainState


def test_the_bad_step_counters_are_saved_and_loaded_with_the_train_state():
    """The device counters of BadSteps are the train state's skipped_steps and bad_streak: one
    source, saved and loaded with it, so a streak goes on across a resume."""
    state = TrainState(step=3)
    for step, ok in enumerate([True, False, False], 1):
        state.bad.record(torch.tensor(ok), step, limit=5)
    assert state.state_dict() == {"step": 3, "best_val": math.inf, "tokens": 0,
                                  "elapsed_s": 0.0, "skipped_steps": 2, "bad_streak": 2}
    resumed = TrainState()
    resumed.load_state_dict(state.state_dict())
    assert (resumed.step, resumed.bad.state_dict()) == (3, {"skipped_steps": 2, "bad_streak": 2})
    resumed.bad.record(torch.tensor(False), 4, limit=5)
    assert resumed.bad.check(5, Path("last.pt"), 3) == 1  # skipped since the resume
    resumed.bad.record(torch.tensor(False), 5, limit=4)
    with pytest.raises(CharlmError, match="^training stopped: 4 steps in a row, up to step 5,"):
        resumed.bad.check(4, Path("last.pt"), 3)
    older = TrainState()
    older.load_state_dict({"step": 7, "best_val": 1.0, "tokens": 9})  # before the counters
    assert (older.step, older.elapsed_s) == (7, 0.0)
    assert older.bad.state_dict() == {"skipped_steps": 0, "bad_streak": 0}
    assert isinstance(BadSteps().state_dict()["skipped_steps"], int)
