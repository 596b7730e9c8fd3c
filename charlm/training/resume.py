"""What a resume takes from the run dir besides its checkpoint (the user's edits of
RUN/config.yaml), and the resumes refused before the run is built."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

from charlm.config.loading import load_config
from charlm.config.schema import RunConfig
from charlm.core.durations import format_duration
from charlm.core.errors import CharlmError
from charlm.core.ranks import is_main_process
from charlm.training import checkpoint


def with_edits(run_dir: Path, saved: dict[str, Any], ckpt_path: Path) -> dict[str, Any]:
    """The checkpoint's config `saved` with the keys the user changed in RUN/config.yaml since
    it was written (said on stderr): an edit counts as --set would, so the architecture stays
    locked. train.out_dir is not read from it: the run dir is where it is."""
    raw = copy.deepcopy(saved)
    path = run_dir / "config.yaml"
    if not path.is_file():  # removed, or not a regular file: the checkpoint's config is the run's
        return raw
    edited = load_config(path).to_dict()
    ours = RunConfig.from_dict(saved, f"{ckpt_path} config").to_dict()
    changes = [(section, key, value) for section, values in edited.items()
               for key, value in values.items()
               if value != ours[section][key] and f"{section}.{key}" != "train.out_dir"]
    for section, key, value in changes:
        if section == "model":
            raise CharlmError(
                f"--resume: model.{key}={value!r} in {path} conflicts with the checkpoint's "
                f"{ours['model'][key]!r} in {ckpt_path}; the architecture of a run cannot "
                "change (undo that edit, or start a new run with another --out)")
        raw.setdefault(section, {})[key] = value
    if changes and is_main_process():  # under torchrun, rank 0 speaks for the run
        shown = ", ".join(f"{s}.{k} {ours[s][k]!r} -> {v!r}" for s, k, v in changes)
        print(f"--resume: applying the edits of {path}: {shown}", file=sys.stderr)
    return raw


def require_steps_left(cfg: RunConfig, ckpt: dict[str, Any], path: Path) -> None:
    """Refuse a resume that would stop at once: the checkpoint (read from `path`) is at or past
    max_iters, or its time budget ended it, and the eval of its step is not still due."""
    try:
        checkpoint.check_train_state(ckpt)
    except ValueError as e:
        raise checkpoint.damaged(path, e) from None
    state, tc = ckpt["train_state"], cfg.train  # as `TrainState.load_state_dict` reads it
    step = state["step"]
    steps = tc.max_iters if tc.max_time is None else state.get("budget_steps")  # None: not ended
    if (not isinstance(steps, int) or step < steps
            or (step == steps and state.get("eval_due", False))):
        return
    end, how = f"train.max_iters is {steps}", ""
    if tc.max_time is not None:
        end = f"its time budget train.max_time={format_duration(tc.max_time)} ended there"
        how = "--set train.max_time=null "
    raise CharlmError(
        f"--resume: nothing to train: {path} is at step {step} and {end}; to train on, resume "
        f"with {how}--set train.max_iters=N (N above {step})")


def require_same_budget(cfg: RunConfig, ckpt: dict[str, Any], iters_set: bool) -> None:
    """A run its time budget ended has decayed its learning rate to the end: refuse another
    train.max_time, or a train.max_iters the user set (`iters_set`), neither of which would
    apply. Malformed parts of `ckpt` are the restore's to report."""
    saved, ts = checkpoint.saved_section(ckpt, "train"), ckpt.get("train_state")
    max_time, saved_time = cfg.train.max_time, saved.get("max_time")
    # an older version's planned steps, ahead of the checkpoint's step, are no end
    budget_steps = (ts.get("budget_steps") if isinstance(ts, dict)
                    and ts.get("budget_steps") == ts.get("step") else None)
    if budget_steps is None or max_time is None or saved_time is None:
        return  # not ended by its budget, or the budget is dropped (max_iters rules)
    if max_time != saved_time:
        key = f"train.max_time={format_duration(max_time)}"
    elif iters_set and cfg.train.max_iters != saved.get("max_iters"):
        key = f"train.max_iters={cfg.train.max_iters}"
    else:
        return
    raise CharlmError(
        f"--resume: {key} cannot apply: the run's time budget train.max_time="
        f"{format_duration(saved_time)} ended it at step {budget_steps}, its schedule decayed "
        "to the end; to train to another step, resume with --set train.max_time=null --set "
        "train.max_iters=N")


def require_same_average(cfg: RunConfig, ckpt: dict[str, Any], path: Path) -> None:
    """Refuse a resume that turns `optim.ema` on or off (a checkpoint with an average holds the
    trained weights beside it, as "train_model")."""
    had = "train_model" in ckpt
    if had == (cfg.optim.ema > 0):
        return
    saved = checkpoint.saved_section(ckpt, "optim").get("ema") if had else 0.0
    if not isinstance(saved, (int, float)) or isinstance(saved, bool):
        raise checkpoint.damaged(path, "optim.ema of its config is not a number")
    raise CharlmError(
        f"--resume: optim.ema={cfg.optim.ema:g} cannot apply: the run was trained "
        f"{'with' if had else 'without'} a weight average (optim.ema={saved:g}); resume with "
        f"--set optim.ema={saved:g}, or start a new run")
