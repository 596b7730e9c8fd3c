"""The batch samplers training draws from, each with its own seeded `torch.Generator` (the one
module of data/ that imports torch): `BatchSampler` for text, and for the encoder-decoder
`PairBatchSampler` and `collate`, which pads and shifts (source, target) ids into tensors. `rows`
keeps a slice of each batch: every DDP rank, seeded alike, draws the same global batch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from charlm.core.errors import CharlmError, characters
from charlm.data.pairs import PairSplit, PairVocab

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


class Seeded:
    """A sampler's seeded generator, whose state is what a checkpoint keeps of it."""

    generator: torch.Generator
    device: torch.device

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)


class PairBatchSampler(Seeded):
    """Batches of pairs of like length, so padding stays small: `batch_size` consecutive pairs
    from a random start in the pairs ordered by length (source + target), equal lengths in a
    seeded random order, wrapping around the end so every pair is drawn equally often."""

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
        src_len = np.diff(split.src_offsets)
        self.order = ties[np.lexsort((src_len[ties], (src_len + np.diff(split.tgt_offsets))[ties]))]
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
        return tuple(map(self.to_device, tensors))


class BatchSampler(Seeded):
    """Random (x, y) windows of one split, a batch gathered by one vectorised memmap index."""

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
        """x, y (B, T) int64 on the device (B: the rows kept), y being x shifted left by one."""
        starts = torch.randint(len(self.data) - self.block_size, (self.batch_size,),
                               generator=self.generator)[self.rows]
        self.tokens += self.batch_size * self.block_size
        index = (starts[:, None] + self._arange).numpy()  # (B, T+1)
        windows = self.to_device(torch.from_numpy(self.data[index].astype(np.int64)))
        # contiguous: a slice's strides would make train.compile build a second graph
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def require_window(data: np.ndarray, block_size: int, split: str,
                   source: str | Path | None = None, prepared: bool = False) -> None:
    """A split must hold a window of block_size + 1 ids (`prepared`: `source` is a dataset dir)."""
    if len(data) < block_size + 1:
        of = f" of {source}" if source is not None else ""
        # a prepared dataset dir has its split fixed: data.val_fraction does not apply to it
        more_val = (" or prepare it again with a larger --val-fraction" if prepared else
                    " or raise data.val_fraction")
        raise CharlmError(
            f"the {split} split{of} is too short: {characters(len(data))}, but one window needs "
            f"block_size + 1 = {block_size + 1}; give more text, or lower model.block_size"
            + (more_val if split == "val" else "")
        )
