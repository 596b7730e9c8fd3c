"""Checkpoints: atomic `save` and safe `load` (tensors and plain containers only), with a format
version. A run saves and `restore`s one map of stateful objects (torchtitan's checkpointer), so
what is saved and what is restored cannot drift apart. Checkpoints by step (`--step`) are the
files of `step_path`'s names in checkpoints/, written with `last.pt`; other files are the user's."""

from __future__ import annotations

import os
import re
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import torch

from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError, Setting, SettingError, first_line, one_line
from charlm.core.files import missing, open_regular, run_write_error, write_atomic
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab
from charlm.runtime.device import require_memory
from charlm.training import tasks

FORMAT = "charlm-checkpoint"
VERSION = 1
STEPS_DIR = "checkpoints"
STEP = Setting("step")  # `charlm.load`'s, the CLI's --step
_STEP_NAME = r"step-([0-9]{6}|[1-9][0-9]{6,})\.pt"  # as `step_path` pads it: no more zeros


def save(state: dict[str, Any], path: Path, run_dir: Path | None = None) -> None:
    """Write `state` to `path` atomically; `run_dir`: the run's, for a failed write's error."""
    path = Path(path)
    try:
        write_atomic(path, lambda f: torch.save({"format": FORMAT, "version": VERSION, **state},
                                                f))
    except BaseException as e:
        # torch's zip writer raises a failed write (a full disk) as a RuntimeError over the OSError
        error = e.__context__ if isinstance(e, RuntimeError) else e
        if isinstance(error, OSError):  # a full disk, a vanished or read-only run dir
            raise run_write_error(f"checkpoint {path}", error, run_dir or path.parent,
                                  f"the previous {path.name}, if any, is unchanged; ") from None
        raise


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


@dataclass
class Entry:
    """A checkpoint entry of two functions, for an object whose own load does not fit."""

    state_dict: Callable[[], Any]
    load_state_dict: Callable[[Any], None]


def load_scaler(scaler: torch.amp.GradScaler, state: dict[str, Any]) -> None:
    """torch refuses `{}`, saved without loss scaling (fp32, bf16): a fp16 resume starts afresh."""
    if state != {}:
        scaler.load_state_dict(state)


@dataclass
class RNGState:
    """torch's global RNG states: the CPU's, and on CUDA every GPU's."""

    device: torch.device

    def state_dict(self) -> dict[str, torch.Tensor]:
        rng = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
        return rng

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        # from CPU tensors: a CUDA one is "RNG state must be a torch.ByteTensor"
        torch.set_rng_state(state["torch"])
        if self.device.type == "cuda" and "cuda" in state:
            torch.cuda.set_rng_state_all(state["cuda"][:torch.cuda.device_count()])


def restore(state: dict[str, Any], objects: Mapping[str, Stateful], path: Path) -> None:
    """Load each object's part of `state` (from `path`); a part missing or unfit is `damaged`."""
    try:
        check_train_state(state)
        tasks.check_weights(state["model"])
        for name, obj in objects.items():
            obj.load_state_dict(state[name])
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as e:
        raise damaged(path, e) from None


def resolve(path: str | Path, step: int | None = None) -> Path:
    """A checkpoint file, or a run dir's best.pt (else last.pt) or, with `step`, that step's."""
    path = Path(path)
    if not path.exists():
        raise missing(path, "checkpoint", f"no such run dir or checkpoint: {path}")
    if step is not None:
        if not path.is_dir():
            raise SettingError(STEP, f" {step} picks a checkpoint of a run dir, and {path} "
                               "is a file; give the run dir, or drop ", STEP)
        return find_step(path, step)
    if path.is_dir():
        for name in ("best.pt", "last.pt"):
            if (path / name).is_file():
                return path / name
        raise CharlmError(f"no checkpoint (best.pt or last.pt) in {path}; train a model first")
    return path


def step_path(run_dir: Path, step: int) -> Path:
    """The run's checkpoint of `step`, padded to 6 digits: names sort by step up to a million."""
    return Path(run_dir) / STEPS_DIR / f"step-{step:06d}.pt"


def saved_steps(run_dir: Path) -> list[int]:
    """The steps of the run's checkpoints, in order: regular files named exactly as `step_path`."""
    folder = Path(run_dir) / STEPS_DIR
    if not folder.is_dir():
        return []
    return sorted(int(match[1]) for path in folder.iterdir()
                  if (match := re.fullmatch(_STEP_NAME, path.name)) and path.is_file())


def prune_steps(run_dir: Path, keep: int) -> None:
    """Remove the run's own step checkpoints but the newest `keep`."""
    for step in saved_steps(run_dir)[:-keep] if keep > 0 else saved_steps(run_dir):
        step_path(run_dir, step).unlink(missing_ok=True)


def remove_temps_of_steps(run_dir: Path) -> None:
    """Remove what killed saves of step checkpoints left (only the run lock's holder may)."""
    for tmp in (Path(run_dir) / STEPS_DIR).glob(".step-*.pt.tmp-*"):  # `temp_beside`'s names
        if re.fullmatch(rf"\.{_STEP_NAME}\.tmp-[0-9]+", tmp.name) and tmp.is_file():
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


def load(path: str | Path) -> dict[str, Any]:
    """A charlm checkpoint, on the CPU, without executing any pickled code."""
    path = Path(path)
    with open_regular(path, "checkpoint") as f:  # a FIFO or /dev/zero: no read would end
        if not zipfile.is_zipfile(f):  # what torch.save writes is a zip
            raise unreadable(path, "not a complete torch.save file")
        # read whole into memory: a file larger than it would only swap or die
        require_memory(os.fstat(f.fileno()).st_size, torch.device("cpu"),
                       f"checkpoint {path} holds {{gib}}", "load it on a machine with more memory")
        check_records(f, path)
        f.seek(0)
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except OSError:
            raise  # an unreadable file: the CLI names it
        except Exception as e:  # arbitrary bytes can make the unpickler raise anything
            if "Weights only load failed" in str(e):  # torch's long advice is not for our users
                why = "it is not a checkpoint, or it holds pickled code, which charlm never runs"
            else:
                why = first_line(e)
            raise unreadable(path, why) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CharlmError(f"{path} is not a charlm checkpoint (it may come from another tool)")
    if state.get("version") != VERSION:
        raise CharlmError(f"{path} has checkpoint format version {state.get('version')}, this "
                          f"charlm reads version {VERSION}")
    return state


def check_records(f: BinaryIO, path: Path) -> None:
    """Refuse a compressed record before it can inflate, and raise `damaged` unless each record
    matches the CRC-32 torch.save stored: torch.load checks none, a flipped bit loads silently."""
    with zipfile.ZipFile(f) as archive:
        packed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
        if packed:
            raise unreadable(path, f"record {packed[0]} is compressed, which torch.save never does")
        bad = archive.testzip()
    if bad is not None:
        raise damaged(path, f"record {bad} fails its CRC-32 check (the file changed after it was "
                            "saved); restore it from a backup, or use the run's other "
                            "checkpoint (best.pt or last.pt)")


def unreadable(path: Path, why: str) -> CharlmError:
    return CharlmError(f"cannot load checkpoint {path}: not a readable charlm checkpoint ({why})")


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


def saved_section(state: dict[str, Any], name: str) -> dict[str, Any]:
    """Section `name` of the checkpoint's config, or {} (read before the restore reports damage)."""
    cfg = state.get("config")
    section = cfg.get(name) if isinstance(cfg, dict) else None
    return section if isinstance(section, dict) else {}


def check_train_state(state: dict[str, Any]) -> None:
    """Raise ValueError unless the checkpoint's train state has the numbers charlm reads."""
    ts = state.get("train_state")

    def count(value: object) -> bool:  # a step or token count: an int >= 0 (a float breaks range)
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    later = ("skipped_steps", "bad_streak", "budget_steps")  # later additions, or saved when set
    if (not isinstance(ts, dict) or not isinstance(ts.get("best_val"), (int, float))
            or not all(count(ts.get(k)) for k in ("step", "tokens"))
            or not all(count(ts.get(k, 0)) for k in later)):
        raise ValueError("train_state is missing or malformed")


def load_model(path: str | Path, device: str | torch.device = "cpu",
               ) -> tuple[torch.nn.Module, Vocab | PairVocab, RunConfig, dict[str, Any]]:
    """(model in eval mode, vocab, config, checkpoint state) of a run dir or checkpoint."""
    ckpt_path = resolve(path)
    state = load(ckpt_path)  # onto the CPU, where the model is built; then moved as a whole
    try:
        cfg = RunConfig.from_dict(check_config(state), f"{ckpt_path} config")
        vocab = tasks.vocab_from_state(state["vocab"])
        tasks.check_stored_shapes(cfg, vocab, state["model"])
        weights = sum(t.numel() * t.element_size() for t in state["model"].values())
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError, CharlmError) as e:
        raise damaged(ckpt_path, e) from None
    device = torch.device(device)
    require_memory(weights, device, f"the model in {ckpt_path} needs {{gib}} for its weights",
                   "load it on a device with more memory (--device)")
    try:
        model = tasks.build_model(cfg, vocab)
        model.load_state_dict(state["model"])
        check_train_state(state)
    except (KeyError, RuntimeError, ValueError, TypeError, CharlmError) as e:
        raise damaged(ckpt_path, e) from None
    return model.to(device).eval(), vocab, cfg, state
