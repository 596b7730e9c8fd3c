"""Which data a run trains on: its text or pairs, prepared into a cache dir where they are not a
dataset dir already, and checked against `model.arch`. Torch-free: `charlm tune`'s own process
prepares the data once for all its trials.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from charlm.config.data import DataConfig
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.corpus import TextOptions, count_reasons
from charlm.data.dataset import Dataset, dataset_for, is_dataset_dir
from charlm.data.pair_dataset import PairDataset, pairs_for
from charlm.data.pair_vocab import PairVocab
from charlm.data.text import dataset_meta, read_meta
from charlm.data.vocab import Vocab


def check_data_kind(cfg: RunConfig, pairs: bool) -> None:
    """model.arch and the data must agree: a GPT trains on text, an encoder-decoder on pairs."""
    if cfg.model.arch == "encoder_decoder" and not pairs:
        raise CharlmError(
            f"model.arch=encoder_decoder trains on pairs, but {cfg.data.shown} is text; give a "
            "\"source<TAB>target\" file (.tsv, or data.format=pairs) or a dataset made by "
            "`charlm prepare --pairs`"
        )
    if cfg.data.units == "byte" and (pairs or cfg.model.arch == "encoder_decoder"):
        raise CharlmError(
            f"data.units=byte is for text and a GPT, but {cfg.data.shown} is trained as pairs "
            "by an encoder-decoder, whose vocabularies are characters; set data.units=char"
        )
    if cfg.model.arch == "decoder" and pairs:
        raise CharlmError(
            f"{cfg.data.shown} holds pairs, but model.arch=decoder trains on text; set "
            "model.arch=encoder_decoder, or data.format=text to train a GPT on its lines"
        )



def prepared_data(cfg: RunConfig, cache_dir: Path,
                  check: Callable[[Any], None] | None = None,
                  base: Vocab | PairVocab | None = None) -> Dataset | PairDataset:
    """The run's data (a text or .tsv file is prepared into `cache_dir`, reused while
    unchanged). `check` sees the data's vocabulary state before a cache is rebuilt. `base`: a
    fine-tuned model's vocabulary, whose ids the data keeps (new characters after them)."""
    pairs = cfg.data.pairs
    if (path := prepared_dir(cfg.data)) is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # the loader says why
            pairs = read_meta(path).get("kind") == "pairs"
    check_data_kind(cfg, pairs)
    if pairs:
        vocab_check = None if check is None else (lambda v: check(v.to_dict()))
        return pairs_for(cfg.data, cfg.model.block_size, cache_dir, vocab_check,
                         base if isinstance(base, PairVocab) else None)
    text_check = None if check is None else (lambda v: check(v.state()))
    return dataset_for(cfg.data.inputs, cfg.data.val_fraction, cache_dir, text_check,
                       text_options(cfg.data), base if isinstance(base, Vocab) else None)


def prepared_dir(data: DataConfig) -> Path | None:
    """data.path when it is a dataset dir made by `charlm prepare` (not a folder of text)."""
    return Path(data.inputs[0]) if len(data.inputs) == 1 and is_dataset_dir(
        Path(data.inputs[0])) else None


def text_options(data: DataConfig) -> TextOptions:
    """How `prepare` reads a run's text: its data section's keys."""
    return TextOptions(split=data.split, skip_invalid=data.skip_invalid, include=data.include,
                       exclude=data.exclude, normalize=data.unicode_normalize,
                       units=data.units)


def data_summary(cfg: RunConfig, run_dir: Path | None) -> dict[str, Any] | None:
    """What `charlm info` says of a run's prepared text: its split, units, files, those skipped
    and the tokens of each split, from the meta.json of its dataset dir or of the cache in
    `run_dir`; None when neither holds a text dataset."""
    where = [] if (prepared := prepared_dir(cfg.data)) is None else [prepared]
    meta = next((m for d in [*where, *([run_dir / "dataset"] if run_dir else [])]
                 if (m := dataset_meta(d)) is not None and m.get("kind") != "pairs"), None)
    if meta is None:
        return None
    return {"split": meta.get("split", "tail"), "units": meta.get("units", "char"),
            "files": len(meta.get("sources", [])),
            "skipped": count_reasons(meta.get("skipped", [])) or None,
            **{f"{s}_tokens": meta[f"{s}_tokens"] for s in ("train", "val", "test")
               if f"{s}_tokens" in meta}}
