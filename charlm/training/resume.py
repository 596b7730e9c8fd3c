"""What a resume takes from the run dir (`resume_config`), and the resumes refused up front."""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from charlm.config.loading import Override, apply_overrides, load_config
from charlm.config.schema import OptimConfig, RunConfig
from charlm.core.durations import format_duration
from charlm.core.errors import CharlmError
from charlm.core.ranks import is_main_process
from charlm.training import checkpoint

ARCHITECTURE = "the architecture of a run cannot change"


def resume_config(run_dir: Path, config_path: str | Path | None,
                  overrides: Sequence[Override]) -> RunConfig:
    """The config of a resumed run: the checkpoint's with the user's edits of RUN/config.yaml
    (`with_edits`), or CONFIG's, then the overrides. One that changes the architecture,
    `optim.name` or the budget of a run its time budget ended is an error."""
    ckpt_path = run_dir / "last.pt"
    if ckpt_path.is_dir():  # not "no checkpoint": a fresh start would send the user back here
        raise CharlmError(f"--resume: {ckpt_path} is a directory, not a checkpoint; move it out "
                          "of the way, then start over with --overwrite")
    if not ckpt_path.exists():  # anything else that is there, `checkpoint.load` explains
        raise CharlmError(f"--resume: no checkpoint {ckpt_path}; start the run without --resume")
    ckpt = checkpoint.load(ckpt_path)
    try:
        saved = checkpoint.check_config(ckpt)
    except ValueError as e:
        raise checkpoint.damaged(ckpt_path, e) from None
    if config_path is not None:
        cfg = load_config(config_path, overrides)
    else:
        raw = apply_overrides(with_edits(run_dir, saved, ckpt_path), overrides)
        cfg = RunConfig.from_dict(raw, f"{ckpt_path} config")
    # without CONFIG, a max_iters other than the checkpoint's is the user's (--set, edit)
    require_same_budget(cfg, ckpt, iters_set=config_path is None)
    saved_train = checkpoint.saved_section(ckpt, "train")
    if saved_train.get("init_from") is not None:  # a fine-tune's parent is its history
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **{
            key: saved_train.get(key) for key in ("init_from", "init_from_sha256")}))
    # Resolved, so a key missing from an older checkpoint's config counts as its default.
    saved_model = RunConfig.from_dict({"model": saved["model"]}, f"{ckpt_path} config").model
    for key, value in dataclasses.asdict(saved_model).items():
        if getattr(cfg.model, key) != value:
            raise _conflict(f"model.{key}={getattr(cfg.model, key)!r}", value, ckpt_path,
                            ARCHITECTURE)
    # a checkpoint from before optim.name: AdamW's
    name = checkpoint.saved_section(ckpt, "optim").get("name", OptimConfig.name)
    if cfg.optim.name != name:  # the optimizer's state holds one optimizer's moments
        raise _conflict(f"optim.name={cfg.optim.name!r}", name, ckpt_path,
                        "a run keeps its optimizer")
    return cfg


def _conflict(setting: str, saved: object, ckpt_path: Path, why: str,
              how: str = "drop the override") -> CharlmError:
    """A resume's change (`setting`, "key=value" as given) of what a run keeps."""
    return CharlmError(f"--resume: {setting} conflicts with the checkpoint's {saved!r} in "
                       f"{ckpt_path}; {why} ({how}, or start a new run with another --out)")


def with_edits(run_dir: Path, saved: dict[str, Any], ckpt_path: Path) -> dict[str, Any]:
    """The checkpoint's config `saved` with the user's edits of RUN/config.yaml (said on stderr),
    each as --set: the architecture stays locked; train.out_dir is not read (the run is there)."""
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
            raise _conflict(f"model.{key}={value!r} in {path}", ours["model"][key], ckpt_path,
                            ARCHITECTURE, "undo that edit")
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
    train.max_time or a train.max_iters the user set (`iters_set`); restore reports a bad `ckpt`."""
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
