"""Fine-tuning (`train.init_from`): the `Parent` a new run starts from, the run's config with the
parent's architecture, the vocabulary its data is numbered in and its first weights. Only the
weights come from the parent (docs/design.md, "Fine-tuning")."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab
from charlm.training import checkpoint, tasks
from charlm.training.run_dir import RUN_FILES

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
    """`cfg` with the parent's architecture, a GPT's units and normal form, and the parent named in
    train.init_from(_sha256). `given`, `data_given`: the model and data keys the user set; one that
    differs from the parent's (but `FREE_KEYS`) is an error, as is a parent in the run's files."""
    run_dir = Path(cfg.train.out_dir)
    if any(parent.weights.resolve().is_relative_to(run_dir.resolve() / name) for name in RUN_FILES):
        raise CharlmError(f"--init-from {parent.weights} is in the run dir {run_dir}, whose run "
                          "the new one replaces (its checkpoints with it); choose another --out")
    theirs = dataclasses.asdict(parent.cfg.model)
    for key in sorted(given):
        value = getattr(cfg.model, key, None)
        if key in theirs and key not in FREE_KEYS and value != theirs[key]:
            raise _conflict(f"model.{key}", value, theirs[key], parent, "architecture")
    text = ({"units": parent.vocab.units, "unicode_normalize": parent.vocab.normalize}
            if isinstance(parent.vocab, Vocab) else {})
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


def _conflict(key: str, value: object, theirs: object, parent: Parent, kept: str) -> CharlmError:
    return CharlmError(
        f"--init-from: {key}={value!r} conflicts with the parent's {theirs!r} in "
        f"{parent.source}; a fine-tuned model keeps its parent's {kept} (drop {key} from the "
        f"config and --set, or train from scratch without --init-from)")


def base_vocab(cfg: RunConfig, ckpt: dict[str, Any] | None,
               parent: Parent | None) -> Vocab | PairVocab | None:
    """The vocabulary whose ids the run's data keeps: a fresh fine-tune's parent's, a resumed
    fine-tune's own (`ckpt`'s); None for a run trained from scratch."""
    if ckpt is not None:  # read with care: the restore says what is damaged
        if checkpoint.saved_section(ckpt, "train").get("init_from") is None:
            return None  # (a resume with a CONFIG may not name the parent: the run's own does)
        try:
            return tasks.vocab_from_state(ckpt["vocab"])
        except (KeyError, TypeError, ValueError, CharlmError):
            return None
    if cfg.train.init_from is not None and parent is None:
        raise CharlmError(f"train.init_from {cfg.train.init_from}: the parent model is not "
                          "loaded; start the run with `charlm train` (it loads it)")
    return None if parent is None else parent.vocab


def unit_rows(vocab: Vocab | PairVocab) -> dict[str, Sequence[str]]:
    """The units along the rows of each weight that a vocabulary sizes (its specials after
    them): a GPT's characters, or an encoder-decoder's source characters and target units."""
    if isinstance(vocab, Vocab):
        return {"wte.weight": vocab.chars, "head.weight": vocab.chars}
    return {"src_wte.weight": vocab.source, "wte.weight": vocab.target,
            "head.weight": vocab.target}


def init_from_parent(model: torch.nn.Module, parent: Parent, vocab: Vocab | PairVocab) -> None:
    """Load the parent's weights into `model`, for `vocab`: the parent's and new characters, each
    new unit's row the mean of the parent's unit rows, before the special rows."""
    old, new = unit_rows(parent.vocab), unit_rows(vocab)
    if type(vocab) is not type(parent.vocab) or any(new[k][:len(v)] != v for k, v in old.items()):
        raise CharlmError(f"the data's vocabulary does not keep the ids of {parent.source}'s; "
                          "give the text itself as the data, not a dataset prepared without "
                          "--init-from")
    weights = {}
    for name, tensor in parent.state.items():
        units, new_units = len(old.get(name, ())), len(new.get(name, ()))
        if new_units > units:
            mean = tensor[:units].mean(0, keepdim=True).expand(new_units - units, *tensor.shape[1:])
            tensor = torch.cat([tensor[:units], mean, tensor[units:]])
        weights[name] = tensor
    with torch.no_grad():
        model.load_state_dict(weights)
