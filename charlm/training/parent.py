"""Fine-tuning (`train.init_from`): the `Parent` a new run starts from (its weights, vocabulary
and config, the file they came from and that file's sha256), the new run's config with the
parent's architecture, units and normal form (`parent_config`), the vocabulary its data is
numbered in (`base_vocab`), and its first weights (`init_from_parent`): every old row where it
was, the rows of characters the parent lacks the mean of the old ones.

Only the weights come from the parent: the optimizer, the step and the schedule start afresh.
Loading the parent is `charlm.api.load`'s (a run dir, a checkpoint or an export), done by the
command; a resume of a fine-tuned run loads its own last.pt and never the parent again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab
from charlm.training.run_dir import RUN_FILES
from charlm.training.tasks import vocab_from_state

# Model keys a fine-tune may change: they change no weight's shape.
FREE_KEYS = frozenset({"dropout", "label_smoothing"})


@dataclass
class Parent:
    """A trained model to fine-tune: `source` as it is recorded (the checkpoint file, or the
    export dir), `weights` the file hashed (the checkpoint, or the export's model.safetensors)."""

    source: str
    weights: Path
    sha256: str
    cfg: RunConfig
    vocab: Vocab | PairVocab
    state: dict[str, torch.Tensor]  # the model's state dict, on the CPU


def parent_config(cfg: RunConfig, given: Collection[str], parent: Parent,
                  data_given: Collection[str] = ()) -> RunConfig:
    """`cfg` with the parent's architecture, its units and normal form (`parent_text`) and the
    parent named in train.init_from and train.init_from_sha256. `given`: the model keys the
    user set (config file, --set), `data_given` the data keys; one that differs from the
    parent's is an error, unless it changes no shape (`FREE_KEYS`), as is a parent that is
    one of the files of the run dir (--overwrite would delete the weights it starts from)."""
    _check_outside(parent.weights, Path(cfg.train.out_dir))
    theirs = dataclasses.asdict(parent.cfg.model)
    for key in sorted(given):
        value = getattr(cfg.model, key, None)
        if key in theirs and key not in FREE_KEYS and value != theirs[key]:
            raise _conflict(f"model.{key}", value, theirs[key], parent, "architecture")
    text = parent_text(parent)
    for key in sorted(set(data_given) & text.keys()):
        if getattr(cfg.data, key) != text[key]:
            raise _conflict(f"data.{key}", getattr(cfg.data, key), text[key], parent,
                            "units and normal form")
    pinned = cfg.train.init_from_sha256
    if pinned is not None and pinned != parent.sha256:
        raise CharlmError(
            f"--init-from: {parent.weights} has sha256 {parent.sha256}, but "
            f"train.init_from_sha256 is {pinned}: the parent's weights changed; give the "
            "parent the config names, or set train.init_from_sha256: null to take these")
    raw = cfg.to_dict()
    raw["model"] = {**theirs, **{k: raw["model"][k] for k in given if k in FREE_KEYS}}
    raw["data"].update(text)
    raw["train"].update(init_from=parent.source, init_from_sha256=parent.sha256)
    return RunConfig.from_dict(raw, f"the config fine-tuning {parent.source}")


def _check_outside(weights: Path, run_dir: Path) -> None:
    """Refuse a parent whose weights are one of the files a new run in `run_dir` replaces."""
    try:
        inside = weights.resolve().relative_to(run_dir.resolve()).parts
    except ValueError:
        return
    if inside and inside[0] in RUN_FILES:
        raise CharlmError(f"--init-from {weights} is in the run dir {run_dir}, whose run the new "
                          "one replaces (its checkpoints with it); choose another --out")


def parent_text(parent: Parent) -> dict[str, str | None]:
    """The data keys a GPT's fine-tune inherits, as its vocabulary records them: its units
    (a byte model's data is bytes) and its normal form; none for an encoder-decoder."""
    if not isinstance(parent.vocab, Vocab):
        return {}
    return {"units": parent.vocab.units, "unicode_normalize": parent.vocab.normalize}


def _conflict(key: str, value: object, theirs: object, parent: Parent, kept: str) -> CharlmError:
    return CharlmError(
        f"--init-from: {key}={value!r} conflicts with the parent's {theirs!r} in "
        f"{parent.source}; a fine-tuned model keeps its parent's {kept} (drop {key} from the "
        f"config and --set, or train from scratch without --init-from)")


def base_vocab(cfg: RunConfig, ckpt: dict[str, Any] | None,
               parent: Parent | None) -> Vocab | PairVocab | None:
    """The vocabulary whose ids the run's data keeps: a fresh fine-tune's parent's, a resumed
    fine-tune's own (`ckpt`'s, whose config names its parent: the parent's characters and those
    added); None for a run trained from scratch, whose data numbers its characters in code
    point order."""
    if ckpt is not None:  # read with care: the restore says what is damaged
        saved = ckpt.get("config")
        train = saved.get("train") if isinstance(saved, dict) else None
        if not isinstance(train, dict) or train.get("init_from") is None:
            return None  # (a resume with a CONFIG may not name the parent: the run's own does)
        try:
            return vocab_from_state(ckpt["vocab"])
        except (KeyError, TypeError, ValueError, CharlmError):
            return None
    if cfg.train.init_from is not None and parent is None:
        raise CharlmError(f"train.init_from {cfg.train.init_from}: the parent model is not "
                          "loaded; start the run with `charlm train` (it loads it)")
    return None if parent is None else parent.vocab


def grow_rows(old: torch.Tensor, units: int, new_units: int) -> torch.Tensor:
    """The rows of `old` (`units` unit rows, then special rows) for `new_units` units: the old
    unit rows first, as they were, then the new units' rows, each the mean of the old unit
    rows, then the special rows."""
    mean = old[:units].mean(0, keepdim=True)
    return torch.cat([old[:units], mean.expand(new_units - units, *old.shape[1:]), old[units:]])


def _row_units(name: str, old: Vocab | PairVocab, new: Vocab | PairVocab) -> tuple[int, int]:
    """(the parent's units, the run's units) along the rows of weight `name`; (0, 0): a weight
    whose rows are no vocabulary's."""
    if isinstance(old, Vocab) and isinstance(new, Vocab):
        return (len(old), len(new)) if name in ("wte.weight", "head.weight") else (0, 0)
    assert isinstance(old, PairVocab) and isinstance(new, PairVocab)
    if name == "src_wte.weight":  # source characters, then the source pad
        return len(old.source), len(new.source)
    if name in ("wte.weight", "head.weight"):  # target units, then pad, bos and eos
        return len(old.target), len(new.target)
    return 0, 0


def _extends(old: Vocab | PairVocab, new: Vocab | PairVocab) -> bool:
    if isinstance(old, Vocab) and isinstance(new, Vocab):
        return new.chars[:len(old)] == old.chars
    return (isinstance(old, PairVocab) and isinstance(new, PairVocab)
            and new.source[:len(old.source)] == old.source
            and new.target[:len(old.target)] == old.target)


def init_from_parent(model: torch.nn.Module, parent: Parent, vocab: Vocab | PairVocab) -> None:
    """Load the parent's weights into `model`, a new model of the parent's architecture for
    `vocab`, the parent's vocabulary extended by the data's new characters: every old
    character keeps its id and its rows (embedding, and an untied head), the new ones get rows
    equal to the mean of the old characters' rows."""
    if not _extends(parent.vocab, vocab):
        raise CharlmError(f"the data's vocabulary does not keep the ids of {parent.source}'s; "
                          "give the text itself as the data, not a dataset prepared without "
                          "--init-from")
    weights = {}
    for name, old in parent.state.items():
        units, new_units = _row_units(name, parent.vocab, vocab)
        weights[name] = grow_rows(old, units, new_units) if new_units > units else old
    with torch.no_grad():
        model.load_state_dict(weights)
