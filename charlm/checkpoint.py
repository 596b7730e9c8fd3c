"""Checkpoints: atomic `save` and safe `load` (`weights_only=True`), with a format version.

A checkpoint holds only tensors and plain containers: model / optimizer / scaler state dicts, the
train state, RNG states as tensors, the resolved config as a dict and the vocab as a list.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

from charlm.config import RunConfig
from charlm.errors import CharlmError, first_line, one_line
from charlm.files import run_write_error, write_atomic
from charlm.model import GPT
from charlm.vocab import Vocab

FORMAT = "charlm-checkpoint"
VERSION = 1


def save(state: dict[str, Any], path: Path) -> None:
    """Write `state` to `path` atomically (`charlm.files.write_atomic`): `path` is always
    either the old or the new complete file."""
    path = Path(path)
    try:
        write_atomic(path, lambda f: torch.save({"format": FORMAT, "version": VERSION, **state},
                                                f))
    except BaseException as e:
        # torch's zip writer reports a write that failed (a full disk) as a RuntimeError raised
        # while handling the OSError, which is the reason to report.
        error = e.__context__ if isinstance(e, RuntimeError) else e
        if isinstance(error, OSError):  # a full disk, a vanished or read-only run dir
            raise run_write_error(f"checkpoint {path}", error, f"the previous {path.name}, if "
                                  "any, is unchanged; ") from None
        raise


def resolve(path: str | Path) -> Path:
    """A checkpoint file, or the best (else last) checkpoint of a run dir."""
    path = Path(path)
    if not path.exists():
        raise CharlmError(f"no such run dir or checkpoint: {path}")
    if path.is_dir():
        for name in ("best.pt", "last.pt"):
            if (path / name).is_file():
                return path / name
        raise CharlmError(f"no checkpoint (best.pt or last.pt) in {path}; train a model first")
    return path


def load(path: str | Path) -> dict[str, Any]:
    """Load a charlm checkpoint onto the CPU without executing any pickled code. (Whoever uses
    it moves the tensors to their device: torch restores RNG states only from CPU tensors.)"""
    path = Path(path)
    if path.exists() and not path.is_file():  # reading a FIFO or /dev/zero would never end
        raise CharlmError(f"cannot load checkpoint {path}: not a regular file (a directory, "
                          "FIFO or device); give a .pt file that charlm train wrote")
    if path.is_file() and not zipfile.is_zipfile(path):  # what torch.save writes is a zip
        raise CharlmError(f"cannot load checkpoint {path}: not a readable charlm checkpoint "
                          "(not a complete torch.save file)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError:
        raise  # a missing or unreadable file: the CLI names it
    except Exception as e:  # arbitrary bytes can make the unpickler raise anything
        if "Weights only load failed" in str(e):  # torch's long advice is not for our users
            why = "it is not a checkpoint, or it holds pickled code, which charlm never runs"
        else:
            why = first_line(e)
        raise CharlmError(
            f"cannot load checkpoint {path}: not a readable charlm checkpoint ({why})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CharlmError(f"{path} is not a charlm checkpoint (it may come from another tool)")
    if state.get("version") != VERSION:
        raise CharlmError(
            f"{path} has checkpoint format version {state.get('version')}, this charlm reads "
            f"version {VERSION}"
        )
    return state


def damaged(path: Path, e: BaseException | str) -> CharlmError:
    """The one-line error for a checkpoint that loads but lacks or garbles a part."""
    return CharlmError(f"checkpoint {path} is damaged or incomplete: {one_line(e)}")


def check_config(state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's config dict; ValueError unless it has a `model` section."""
    cfg = state.get("config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise ValueError("no config" if cfg is None else "config is not a mapping with a model "
                         "section")
    return cfg


def check_train_state(state: dict[str, Any]) -> None:
    """Raise ValueError unless the checkpoint's train state has the numbers charlm reads."""
    ts = state.get("train_state")

    def count(value: object) -> bool:  # a step or token count: an int >= 0 (a float breaks range)
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    # skipped_steps and bad_streak are later additions: 0 in older checkpoints
    if (not isinstance(ts, dict) or not isinstance(ts.get("best_val"), (int, float))
            or not all(count(ts.get(k)) for k in ("step", "tokens"))
            or not all(count(ts.get(k, 0)) for k in ("skipped_steps", "bad_streak"))):
        raise ValueError("train_state is missing or malformed")


def load_model(path: str | Path, device: str | torch.device = "cpu",
               ) -> tuple[GPT, Vocab, RunConfig, dict[str, Any]]:
    """(model in eval mode, vocab, config, checkpoint state) from a run dir or checkpoint."""
    ckpt_path = resolve(path)
    state = load(ckpt_path)  # onto the CPU, where the model is built; then moved as a whole
    try:
        cfg = RunConfig.from_dict(check_config(state), f"{ckpt_path} config")
        vocab = Vocab(state["vocab"])
        model = GPT(cfg.model, len(vocab))
        model.load_state_dict(state["model"])
        check_train_state(state)
    except (KeyError, RuntimeError, ValueError, TypeError, CharlmError) as e:
        raise damaged(ckpt_path, e) from None
    return model.to(device).eval(), vocab, cfg, state
