"""The checkpoints a run keeps by step (`train.keep_checkpoints`): `checkpoints/step-000500.pt`,
written with each `last.pt`, pruned to the newest N and found by step (`--step 500`). Only files
of exactly this name are the run's: anything else in checkpoints/ is the user's and stays."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from charlm.core.errors import Setting, SettingError

STEPS_DIR = "checkpoints"
STEP = Setting("step")  # `charlm.load`'s, the CLI's --step
_NAME = r"step-([0-9]{6}|[1-9][0-9]{6,})\.pt"  # as `step_path` pads it: no other zeros in front


def step_path(run_dir: Path, step: int) -> Path:
    """Where the run in `run_dir` keeps its checkpoint of `step` (zero-padded to 6 digits, so
    the names sort by step up to a million)."""
    return Path(run_dir) / STEPS_DIR / f"step-{step:06d}.pt"


def saved_steps(run_dir: Path) -> list[int]:
    """The steps whose checkpoints the run keeps, in order: regular files named exactly as
    `step_path` names them."""
    folder = Path(run_dir) / STEPS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(match[1]) for path in folder.iterdir()
                  if (match := re.fullmatch(_NAME, path.name)) and path.is_file())


def prune(run_dir: Path, keep: int) -> None:
    """Remove the run's own step checkpoints but the newest `keep`."""
    for step in saved_steps(run_dir)[:-keep] if keep > 0 else saved_steps(run_dir):
        step_path(run_dir, step).unlink(missing_ok=True)


def clear(run_dir: Path) -> None:
    """Remove every step checkpoint of the run and what a killed save left half-written, then
    checkpoints/ itself if nothing else is in it."""
    folder = Path(run_dir) / STEPS_DIR
    prune(run_dir, 0)
    remove_temps_of_steps(run_dir)
    with contextlib.suppress(OSError):  # not there, or the user's files are: they stay
        folder.rmdir()


def remove_temps_of_steps(run_dir: Path) -> None:
    """Remove what killed saves of step checkpoints left (only the run lock's holder may)."""
    for tmp in (Path(run_dir) / STEPS_DIR).glob(".step-*.pt.tmp-*"):  # `temp_beside`'s names
        if re.fullmatch(rf"\.{_NAME}\.tmp-[0-9]+", tmp.name) and tmp.is_file():
            tmp.unlink(missing_ok=True)


def find_step(run_dir: Path, step: int) -> Path:
    """The checkpoint of `step` that the run keeps; else an error that lists those it keeps."""
    path = step_path(run_dir, step)
    if path.is_file():
        return path
    steps = saved_steps(run_dir)
    if not steps:
        raise SettingError(STEP, f" {step}: {run_dir} keeps no checkpoints by step (it was "
                           "trained with train.keep_checkpoints=0); use its best.pt or last.pt "
                           "(drop ", STEP, "), or train with train.keep_checkpoints=N")
    kept = ", ".join(map(str, steps[:20])) + (f", ... ({len(steps)} in all)"
                                              if len(steps) > 20 else "")
    raise SettingError(STEP, f" {step}: {run_dir} keeps no checkpoint of step {step}; its "
                       f"{STEPS_DIR}/ holds steps {kept}")
