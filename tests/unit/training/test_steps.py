"""charlm.training.steps: the checkpoints a run keeps by step, which files are its own, pruning
to the newest, and finding one by its step."""

import pytest

from charlm.core.errors import CharlmError
from charlm.training import steps


def test_only_files_of_the_exact_name_are_the_runs_and_prune_keeps_the_newest(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("step-000500.pt", "step-000100.pt", "step-1500000.pt", "step-000900.pt",
                 "step-500.pt", "step-0000100.pt", "step-000200.pt.bak", "notes.txt"):
        (folder / name).write_bytes(b"x")
    (folder / "step-000700.pt").mkdir()
    assert steps.step_path(tmp_path, 500) == folder / "step-000500.pt"
    assert steps.saved_steps(tmp_path) == [100, 500, 900, 1500000]
    steps.prune(tmp_path, 2)
    assert {p.name for p in folder.iterdir()} == {
        "notes.txt", "step-000200.pt.bak", "step-000700.pt", "step-0000100.pt", "step-000900.pt",
        "step-1500000.pt", "step-500.pt"}


def test_a_step_that_is_not_kept_is_one_error_that_lists_those_that_are(tmp_path):
    with pytest.raises(CharlmError) as e:
        steps.find_step(tmp_path, 500)
    assert str(e.value) == (
        f"step 500: {tmp_path} keeps no checkpoints by step (it was trained with "
        "train.keep_checkpoints=0); use its best.pt or last.pt (drop step), or train with "
        "train.keep_checkpoints=N")
    (tmp_path / "checkpoints").mkdir()
    for step in (100, 200):
        steps.step_path(tmp_path, step).write_bytes(b"x")
    assert steps.find_step(tmp_path, 200) == tmp_path / "checkpoints" / "step-000200.pt"
    with pytest.raises(CharlmError) as e:
        steps.find_step(tmp_path, 150)
    assert str(e.value) == (f"step 150: {tmp_path} keeps no checkpoint of step 150; its "
                            "checkpoints/ holds steps 100, 200")
