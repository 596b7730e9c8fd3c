"""What a resume takes from the run dir besides its checkpoint, and when it has nothing to do:
the user's edits of RUN/config.yaml (`with_edits`, which `run_dir.resume_config` applies) and
the refusal of a resume that would stop at once (`require_steps_left`). That a time budget's
fixed steps cannot change is `budget.require_same_budget`."""

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
    it was written (said on stderr): an edit there counts as --set would, so the architecture
    stays locked, and --set wins over it. The run dir is where config.yaml is, whatever
    train.out_dir it names."""
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
    """Refuse, before the run is built, a resume that would stop at once: the checkpoint
    (read from `path`) is at or past max_iters, or at the end of its time budget (the last step
    it planned, `budget.Budget`), and the eval of its step is not still due."""
    try:
        checkpoint.check_train_state(ckpt)
    except ValueError as e:
        raise checkpoint.damaged(path, e) from None
    state, tc = ckpt["train_state"], cfg.train  # as `TrainState.load_state_dict` reads it
    step = state["step"]
    steps = tc.max_iters if tc.max_time is None else state.get("budget_steps")  # None: unplanned
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
