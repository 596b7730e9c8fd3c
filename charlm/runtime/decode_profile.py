"""The decode layout: how a decoding model's large float32 CPU products are computed on this
machine (`DecodeLayout`), chosen once by timing them (`decode_layout`) before the first decode
step, by whoever owns the model (the serve engine, `charlm.api.LM`), and applied by
`charlm.model.layers.lay_out_for_decoding`. The model's code only reads the choice: it never
times the machine nor caches a decision, so a decode computes one way throughout and the choice
can be printed, given explicitly or tested without a clock (`faster` is injectable).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.model.layers import decoding_linears, product, split_product

PROBE_COUNT, PROBE_SIDE = 12, 1024  # `probe_weights`: 48 MiB of float32


@dataclass(frozen=True)
class DecodeLayout:
    """How `Linear`s multiply a few rows by a large float32 CPU weight: split over
    `split_parts` threads (1: plain F.linear) and/or with the weight stored column-major (the
    same values, its transpose contiguous; such a weight is multiplied by F.linear, unsplit)."""

    split_parts: int = 1
    column_major: bool = False

    def describe(self) -> str:
        """A short phrase for a one-line report."""
        if self.column_major:
            return "decode weights column-major"
        if self.split_parts > 1:
            return f"decode products split over {self.split_parts} threads"
        return "decode products unsplit"


def probe_weights() -> torch.Tensor:
    """PROBE_COUNT float32 weights of PROBE_SIDE x PROBE_SIDE, (PROBE_COUNT, side, side): more
    bytes than most CPUs' last-level cache holds, so products by them in turn stream them from
    memory, as a decode step streams a model's weights. (On one 1024 x 1024 weight, which a
    cache holds, a 2-core EPYC's answers flipped from one process to the next, and a served
    model decoded one row at 120 or 200 characters a second by chance.)"""
    return torch.full((PROBE_COUNT, PROBE_SIDE, PROBE_SIDE), 0.01)


def faster(a: Callable, b: Callable, rounds: int = 7) -> bool:
    """Whether a takes less time than b: the medians of `rounds` timed calls of each, called in
    turn (a b a b ...) after one untimed call of each, so that a machine whose speed drifts
    slows both alike."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for f, ts in zip((a, b), times, strict=True):
            start = time.perf_counter()
            f()
            ts.append(time.perf_counter() - start)
    return statistics.median(times[0]) < statistics.median(times[1])


def decode_layout(threads: int, *, column_major: bool = True,
                  faster: Callable[[Callable, Callable], bool] = faster) -> DecodeLayout:
    """The layout that multiplies 1 and 16 rows by large float32 weights fastest here, timed
    on `probe_weights` by `faster` (injectable). Split over gcd(PROBE_SIDE, threads) blocks
    where one-row products run faster so (some BLAS, MKL on AMD EPYCs, computes one row on one
    core: up to twice as fast; others use every core, where the split is slower); column-major
    where that beats the row-major products so chosen (69 against 204 microseconds for 16 rows
    by a 1536 x 384 weight on a 2-core Xeon). Without column_major only the split is timed."""
    with torch.inference_mode():
        rows, x = probe_weights(), torch.randn(1, PROBE_SIDE)
        parts = math.gcd(PROBE_SIDE, threads)
        if parts > 1 and not faster(lambda: [split_product(x, w, None, parts) for w in rows],
                                    lambda: [F.linear(x, w) for w in rows]):
            parts = 1
        if not column_major:
            return DecodeLayout(parts)
        columns = rows.transpose(1, 2).contiguous().transpose(1, 2)  # the same values
        xs = [x, torch.randn(16, PROBE_SIDE)]
        return DecodeLayout(parts, faster(
            lambda: [F.linear(x, w) for x in xs for w in columns],
            lambda: [product(x, w, None, parts) for x in xs for w in rows]))


def layout_for(model: nn.Module, *, column_major: bool = True) -> DecodeLayout:
    """`decode_layout` over torch's threads where `model` has a weight a layout changes
    (`decoding_linears`), else DecodeLayout() without timing anything (a small model, bf16,
    a GPU). column_major=False: the split only, for a model whose weights must stay row-major."""
    if not decoding_linears(model):
        return DecodeLayout()
    return decode_layout(torch.get_num_threads(), column_major=column_major)
