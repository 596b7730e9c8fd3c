"""A run dir: its files (`RUN_FILES`), the lock a run holds on it, the checks before a run starts
there and what --overwrite clears."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from charlm.config.loading import load_config, save_config
from charlm.config.schema import RunConfig
from charlm.config.yaml_files import read_yaml_file
from charlm.core.errors import CharlmError
from charlm.core.files import locked_dir, make_writable_dir, remove_temps, some, strangers
from charlm.training import checkpoint
from charlm.training.metrics import TB_EVENTS

# What a run writes, and all that --overwrite removes (of tb/, only TensorBoard's event files;
# of checkpoints/, only its step-NNNNNN.pt files, see `checkpoint.step_path`).
RUN_FILES = ("last.pt", "best.pt", "metrics.jsonl", "tb", "config.yaml", checkpoint.STEPS_DIR)
# Made before a run's first step, and kept by --overwrite: the dataset cache of `charlm train
# TEXT` (reused while its text is unchanged), and the config and log of a `charlm tune` trial.
KEPT = ("dataset", "trial.yaml", "train.log")


def _is_own(path: Path) -> bool:
    """Whether what is at `path`, one of `RUN_FILES`, is what charlm writes there."""
    if path.name in ("tb", checkpoint.STEPS_DIR):
        return path.is_dir()
    if not path.is_file():
        return False
    if path.name == "config.yaml":  # with every key, as a run writes it (a user's has fewer)
        try:
            raw, full = read_yaml_file(path), load_config(path).to_dict()
        except (CharlmError, OSError):
            return False
        return isinstance(raw, dict) and raw.keys() == full.keys() and all(
            isinstance(raw[s], dict) and raw[s].keys() == full[s].keys() for s in full)
    if path.name == "metrics.jsonl":
        return True
    try:  # a checkpoint, read without its tensors (mmap): a large one costs what a small one does
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a torch zip, or pickled code: whatever it is, it is not ours
        return False
    return isinstance(state, dict) and state.get("format") == checkpoint.FORMAT


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to start a fresh run over an existing one unless told to, or in a non-empty
    directory that holds no run; make sure the run dir is writable. Removes nothing."""
    if run_dir.exists() and not run_dir.is_dir():
        raise CharlmError(f"train.out_dir {run_dir} is a file; choose a directory")
    if run_dir.is_dir() and not resume:
        # a run: a checkpoint, or the complete config a run writes first (not another tool's)
        if any(_is_own(run_dir / name) for name in ("last.pt", "best.pt", "config.yaml")):
            _check_run_files(run_dir, overwrite)
        else:
            # files of a run's names are not a run's here; its killed saves' temporaries may be
            # (a run killed while writing its first config.yaml): `start_run` removes them
            others = sorted({*strangers(run_dir, (*KEPT, *RUN_FILES)),
                             *set(RUN_FILES).intersection(os.listdir(run_dir))})
            if others:
                raise CharlmError(
                    f"{run_dir} is not empty and holds no charlm run ({some(others)}); give a "
                    "new or empty directory as --out, or a run dir to replace")
    make_writable_dir(run_dir, f"run dir {run_dir}")


def _check_run_files(run_dir: Path, overwrite: bool) -> None:
    """A run is there: refused without --overwrite; with it, each file of a run's names must be
    what charlm writes (another tool's best.pt, a directory named last.pt, are not ours)."""
    existing = [n for n in RUN_FILES if (run_dir / n).exists()]
    if not overwrite:
        # A run stopped before its first checkpoint has files but nothing to resume from.
        how = "continue it with --resume, " if (run_dir / "last.pt").is_file() else ""
        raise CharlmError(
            f"{run_dir} already holds a run ({', '.join(existing)}); {how}start over with "
            "--overwrite, or choose another --out")
    odd = [n for n in existing if not _is_own(run_dir / n)]
    if odd:
        raise CharlmError(f"{run_dir / odd[0]} is not what charlm writes there, and --overwrite "
                          "removes only a run's own files; move it out of the way, or choose "
                          "another --out")


def clear_run(run_dir: Path) -> None:
    """--overwrite: remove the previous run's files, only those charlm wrote (see `RUN_FILES`).
    config.yaml goes last, so a run stopped in between is still known as a run."""
    checkpoint.prune_steps(run_dir, 0)
    checkpoint.remove_temps_of_steps(run_dir)
    for event in (run_dir / "tb").glob(TB_EVENTS):
        event.unlink(missing_ok=True)
    for folder in ("tb", checkpoint.STEPS_DIR):
        with contextlib.suppress(OSError):  # only when empty: the user's files stay
            (run_dir / folder).rmdir()
    for name in ("last.pt", "best.pt", "metrics.jsonl", "config.yaml"):
        (run_dir / name).unlink(missing_ok=True)


def start_run(run_dir: Path, cfg: RunConfig) -> None:
    """Write the run's resolved config, after removing the temporary files of a killed run's
    half-done saves (only the holder of the run lock may: no other process writes there)."""
    for name in RUN_FILES:
        remove_temps(run_dir / name)
    checkpoint.remove_temps_of_steps(run_dir)
    save_config(cfg, run_dir / "config.yaml")


def run_lock(run_dir: Path, enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """The run dir's `locked_dir` for the run: a second train or a prepare into it is refused."""
    if not enabled:
        return contextlib.nullcontext()
    return locked_dir(run_dir, f"{run_dir} is in use by another `charlm train`; wait for it to "
                               "end, or choose another --out")
