"""Which data a run trains on, and the batches drawn from it.

`prepared_data`: the run's text or pairs, prepared into a cache dir where they are not a
dataset dir already, and checked against `model.arch` (torch-free: `charlm tune`'s own process
prepares the data once for all its trials). The samplers, each with its own seeded
`torch.Generator`: `BatchSampler`, random windows of a text split (one vectorised gather from
the memmap), and for the encoder-decoder `collate`, which pads and shifts (source, target) ids
into tensors, and the length-bucketed `PairBatchSampler` over a split of pairs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from charlm.config.data import DataConfig
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.datasets import Dataset, dataset_for, is_dataset_dir, require_window
from charlm.data.pairs import PairDataset, PairSplit, pairs_for
from charlm.data.prepare import TextOptions, count_reasons, dataset_meta, read_meta
from charlm.data.vocab import PairVocab, Vocab

IGNORE_INDEX = -1  # tgt_out's padding: the loss's ignore_index


def collate(examples: Sequence[tuple[Sequence[int], Sequence[int]]], vocab: PairVocab
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """src (B, S) padded with src_pad; tgt_in (B, T) = bos + target, padded with pad;
    tgt_out (B, T) = target + eos, padded with IGNORE_INDEX. S: the longest source, T: the
    longest target + 1. All int64."""
    if not examples:
        raise ValueError("collate needs at least one example")
    B = len(examples)
    S = max(len(s) for s, _ in examples)
    T = max(len(t) for _, t in examples) + 1
    src = np.full((B, S), vocab.src_pad, dtype=np.int64)
    tgt_in = np.full((B, T), vocab.pad, dtype=np.int64)
    tgt_out = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
    for row, (s, t) in enumerate(examples):
        src[row, :len(s)] = s
        tgt_in[row, 0] = vocab.bos
        tgt_in[row, 1:len(t) + 1] = t
        tgt_out[row, :len(t)] = t
        tgt_out[row, len(t)] = vocab.eos
    return torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out)


class PairBatchSampler:
    """Batches of pairs of like length, drawn with its own seeded generator.

    The pairs are ordered by length (source + target), equal lengths in a seeded random order
    (not alphabetical); a batch is `batch_size` consecutive pairs of that order from a random
    start, so its padding stays small. The window wraps around the end: every pair is drawn
    equally often (without it the shortest and longest batch_size - 1 pairs would be drawn
    less). `rows` keeps a slice of each batch: every DDP rank, seeded alike, draws the same
    global batch and keeps its own shard.
    """

    def __init__(self, split: PairSplit, vocab: PairVocab, batch_size: int,
                 device: torch.device, seed: int, rows: slice = slice(None)):
        if not len(split):
            raise CharlmError("the split holds no pairs to draw batches from; give more pairs "
                              "or change data.val_fraction / data.test_fraction")
        self.split, self.vocab, self.device, self.rows = split, vocab, device, rows
        self.batch_size = min(batch_size, len(split))  # fewer pairs: all of them
        # by total length, then source length (of two pairs of one total, the one with the
        # like source has the like target too), then a random order fixed by the seed alone
        ties = torch.randperm(len(split), generator=torch.Generator().manual_seed(seed)).numpy()
        self.order = ties[np.lexsort((np.diff(split.src_offsets)[ties], split.lengths()[ties]))]
        self.generator = torch.Generator().manual_seed(seed)
        self.tokens = 0  # target units drawn, end ids included (whole batches), for the log

    def batch(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """src (B, S), tgt_in (B, T), tgt_out (B, T) as `collate`, on the device."""
        n = len(self.order)
        start = int(torch.randint(n, (1,), generator=self.generator))
        drawn = self.order[(start + np.arange(self.batch_size)) % n]
        self.tokens += int(np.diff(self.split.tgt_offsets)[drawn].sum()) + len(drawn)
        picked = drawn[self.rows]
        tensors = collate([self.split.example(i) for i in picked], self.vocab)
        if self.device.type == "cuda":
            return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in tensors)
        return tuple(t.to(self.device) for t in tensors)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])


class BatchSampler:
    """Random (x, y) windows of one split, drawn with its own seeded generator.

    All rows of a batch are gathered with one vectorised index into the memmap. `rows` keeps a
    slice of each batch: the generator still draws all `batch_size` starts, so every DDP rank,
    seeded alike, sees the same global batch and keeps its own shard of it.
    """

    def __init__(self, data: np.ndarray, block_size: int, batch_size: int,
                 device: torch.device, seed: int, name: str = "train",
                 rows: slice = slice(None)):
        require_window(data, block_size, name)
        self.data = data
        self.block_size = block_size
        self.batch_size = batch_size
        self.device = device
        self.rows = rows
        self.generator = torch.Generator().manual_seed(seed)
        self._arange = torch.arange(block_size + 1)
        self.tokens = 0  # target tokens drawn (of whole batches, every rank's rows), for the log

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y of shape (B, T) as int64 on the device (B: the rows kept); y is x shifted left
        by one."""
        starts = torch.randint(len(self.data) - self.block_size, (self.batch_size,),
                               generator=self.generator)[self.rows]
        self.tokens += self.batch_size * self.block_size
        index = (starts[:, None] + self._arange).numpy()  # (B, T+1)
        windows = torch.from_numpy(self.data[index].astype(np.int64))
        if self.device.type == "cuda":
            windows = windows.pin_memory().to(self.device, non_blocking=True)
        else:
            windows = windows.to(self.device)
        # contiguous: the strides of a slice of windows are not those of the (B, T) batch that
        # train.compile builds its graph for, and would make it compile a second graph
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])


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
