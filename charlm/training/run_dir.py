"""What belongs to a run dir: its files (`RUN_FILES`), the lock a run holds on it, refusing to
start over an existing run, clearing one for --overwrite, removing what a killed run left
half-saved, and the config of a resumed run (`resume_config`)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

from charlm.config.loading import Override, apply_overrides, load_config, save_config
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.core.files import locked_dir, make_writable_dir, remove_temps
from charlm.training import checkpoint

RUN_FILES = ("last.pt", "best.pt", "metrics.jsonl", "tb", "config.yaml")


def resume_config(run_dir: Path, config_path: str | Path | None,
                  overrides: Sequence[Override]) -> RunConfig:
    """The config of a resumed run: the checkpoint's (or CONFIG's) with overrides applied.

    The architecture comes from the checkpoint: an override or CONFIG that changes it is an error.
    """
    ckpt_path = run_dir / "last.pt"
    if ckpt_path.is_dir():  # not "no checkpoint": a fresh start would send the user back here
        raise CharlmError(f"--resume: {ckpt_path} is a directory, not a checkpoint; move it out "
                          "of the way, or start over with --overwrite")
    if not ckpt_path.exists():  # anything else that is there, `checkpoint.load` explains
        raise CharlmError(f"--resume: no checkpoint {ckpt_path}; start the run without --resume")
    try:
        saved = checkpoint.check_config(checkpoint.load(ckpt_path))
    except ValueError as e:
        raise checkpoint.damaged(ckpt_path, e) from None
    if config_path is not None:
        cfg = load_config(config_path, overrides)
    else:
        raw = apply_overrides(copy.deepcopy(saved), overrides)
        cfg = RunConfig.from_dict(raw, f"{ckpt_path} config")
    # Resolved, so a key missing from an older checkpoint's config counts as its default.
    saved_model = RunConfig.from_dict({"model": saved["model"]}, f"{ckpt_path} config").model
    for key, value in dataclasses.asdict(saved_model).items():
        new = getattr(cfg.model, key)
        if new != value:
            raise CharlmError(
                f"--resume: model.{key}={new!r} conflicts with the checkpoint's {value!r} in "
                f"{ckpt_path}; the architecture of a run cannot change (drop the override, or "
                "start a new run with another --out)"
            )
    return cfg


def check_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to start a fresh run over an existing one unless told to; make sure the run dir
    is writable. Removes nothing (see `clear_run`)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise CharlmError(f"train.out_dir {run_dir} is a file; choose a directory")
    existing = [n for n in RUN_FILES if (run_dir / n).exists()]
    if existing and not resume and not overwrite:
        # A run stopped before its first checkpoint has files but nothing to resume from.
        how = "continue it with --resume, " if "last.pt" in existing else ""
        raise CharlmError(
            f"{run_dir} already holds a run ({', '.join(existing)}); {how}start over with "
            "--overwrite, or choose another --out"
        )
    make_writable_dir(run_dir, f"run dir {run_dir}")


def clear_run(run_dir: Path) -> None:
    """--overwrite: remove the previous run's files (the prepared dataset cache stays)."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def start_run(run_dir: Path, cfg: RunConfig) -> None:
    """Write the run's resolved config, after removing the temporary files of a killed run's
    half-done saves (only the holder of the run lock may: no other process writes there)."""
    for name in RUN_FILES:
        remove_temps(run_dir / name)
    save_config(cfg, run_dir / "config.yaml")


@contextlib.contextmanager
def run_lock(run_dir: Path, enabled: bool = True) -> Iterator[None]:
    """Hold the lock on the run dir (`locked_dir`) for the whole run, so a second `charlm train`
    into it (a fresh start or a --resume), or a `charlm prepare` into a folder inside it, is
    refused instead of interleaving its files with this one's. An empty run dir made here (a
    run that failed before writing anything, such as `charlm train` on a mistyped file name)
    is removed again."""
    if not enabled:
        yield
        return
    with locked_dir(run_dir, f"{run_dir} is in use by another `charlm train`; wait for it to "
                             "end, or choose another --out"):
        yield
