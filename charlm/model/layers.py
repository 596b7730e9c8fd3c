"""What the models add to torch's layers: `Linear`, whose product of a few rows by a large
float32 weight on the CPU may be split over the threads (`split_product`, where this machine's
BLAS runs such a product on one core), `lay_out_for_decoding`, which stores such weights
column-major where this machine's BLAS multiplies a few rows by them faster that way,
`Embedding`, whose initial draw skips the meta device
(`normal_`), and `maybe_dropout`, which skips dropout's call where it does nothing.

Everything else the models build from is torch's own (`nn.LayerNorm`, plain `nn.Module`
children).
"""

from __future__ import annotations

import functools
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SPLIT_ROWS = 64  # up to this many rows a split product can beat F.linear
# From this many values in a weight (512 KiB of float32) the split can win; below it, the threads'
# start and join cost more than the product.
SPLIT_MIN_WEIGHTS = 1 << 17
PROBE_COUNT, PROBE_SIDE = 12, 1024  # `probe_weights`: 48 MiB of float32


class Linear(nn.Linear):
    """`nn.Linear`, whose float32 product on the CPU with a few rows (a decode step, a small
    batch of samples or beams) by a large weight, outside autograd and outside a compiled
    graph, is split over the threads where that pays on this machine (`split_pays`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return product(x, self.weight, self.bias)


def product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, w, bias) as `Linear` computes it: split over the threads for a few rows by a
    large float32 CPU weight outside autograd and outside a compiled graph, where that pays."""
    if (torch.is_grad_enabled() or w.dtype is not torch.float32 or not w.is_cpu
            or torch.compiler.is_compiling()):
        return F.linear(x, w, bias)  # training leaves at the first test
    N, K = w.shape
    parts = math.gcd(N, torch.get_num_threads())
    if (parts == 1 or N * K < SPLIT_MIN_WEIGHTS or x.numel() > SPLIT_ROWS * K
            or x.shape[-1] != K or not w.is_contiguous() or not split_pays(parts)):
        return F.linear(x, w, bias)
    return split_product(x, w, bias, parts)


def split_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                  parts: int) -> torch.Tensor:
    """F.linear(x, w, bias) for x (..., K) of M rows, w (N, K): w's rows in `parts` equal
    blocks, one batched product (N / parts, K) @ (K, M) per block, which BLAS runs a block per
    thread. The sums are the same dot products, so the result matches F.linear's within
    rounding."""
    N, K = w.shape
    M = x.numel() // K
    blocks = w.view(parts, N // parts, K)
    if M == 1 and x.is_contiguous():  # a decode step: the fewest ops (each costs microseconds)
        y = torch.bmm(blocks, x.as_strided((parts, K, 1), (0, 1, K)))  # (parts, N / parts, 1)
        y = y.view(*x.shape[:-1], N)
    else:
        columns = x.reshape(M, K).t().expand(parts, K, M)  # strides BLAS takes as a transpose
        y = torch.bmm(blocks, columns).permute(2, 0, 1).reshape(*x.shape[:-1], N)
    return y if bias is None else y.add_(bias)


@functools.cache
def split_pays(parts: int) -> bool:
    """Whether one-row products by large float32 weights run faster as `split_product` over
    `parts` threads than as F.linear on this machine, timed once per process on
    `probe_weights` (`faster`). Some CPUs' BLAS (MKL on AMD EPYCs) computes a one-row product on
    one core, where the split is up to twice as fast; others use every core, where it is
    slower. The answer is the same for every call of the process, so a decode's products are
    computed one way throughout."""
    with torch.inference_mode():
        ws, x = probe_weights(), torch.randn(1, PROBE_SIDE)
        return faster(lambda: [split_product(x, w, None, parts) for w in ws],
                      lambda: [F.linear(x, w) for w in ws])


def lay_out_for_decoding(model: nn.Module) -> int:
    """Store each large float32 CPU weight of `model`'s `Linear`s column-major (the same values,
    its transpose contiguous in memory) where this machine's BLAS multiplies a few rows by a
    weight faster that way (`column_major_pays`); the number of weights re-laid (0 elsewhere).

    F.linear multiplies by the weight's transpose, which is then contiguous: on a 2-core Xeon
    (Emerald Rapids), 16 rows by the baby GPT's 1536 x 384 weight took 69 against 204
    microseconds. For a model that only decodes (`charlm serve`'s engine): products give the
    same values within rounding, training is unaffected, and such a weight is not contiguous
    (safetensors saves only contiguous tensors)."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, Linear)
               and m.weight.dtype is torch.float32 and m.weight.is_cpu
               and m.weight.numel() >= SPLIT_MIN_WEIGHTS and m.weight.is_contiguous()}
    if not weights or not column_major_pays(torch.get_num_threads()):
        return 0
    with torch.no_grad():
        for w in weights.values():  # a tied weight once
            w.data = w.data.t().contiguous().t()
    return len(weights)


@functools.cache
def column_major_pays(threads: int) -> bool:
    """Whether products of 1 and of 16 rows by large float32 weights take less time in all with
    the weights column-major than as `Linear` computes them row-major (split where that pays),
    timed once per process and thread count on `probe_weights` (`faster`)."""
    with torch.inference_mode():
        rows = probe_weights()
        columns = rows.transpose(1, 2).contiguous().transpose(1, 2)  # the same values
        xs = [torch.randn(1, PROBE_SIDE), torch.randn(16, PROBE_SIDE)]
        return faster(lambda: [F.linear(x, w) for x in xs for w in columns],
                      lambda: [product(x, w, None) for x in xs for w in rows])


def probe_weights() -> torch.Tensor:
    """PROBE_COUNT float32 weights of PROBE_SIDE x PROBE_SIDE, (PROBE_COUNT, side, side): more
    bytes than most CPUs' last-level cache holds, so products by them in turn stream them from
    memory, as a decode step streams a model's weights. (On one 1024 x 1024 weight, which a
    cache holds, a 2-core EPYC's answers flipped from one process to the next, and a served
    model decoded one row at 120 or 200 characters a second by chance.)"""
    return torch.full((PROBE_COUNT, PROBE_SIDE, PROBE_SIDE), 0.01)


def faster(a, b, rounds: int = 7) -> bool:
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


def maybe_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, minus the call when it is the identity (decoding runs this per layer per
    token)."""
    return F.dropout(x, p, training) if training and p > 0 else x


class Embedding(nn.Embedding):
    """`nn.Embedding`, whose `reset_parameters` draws by `normal_` (the same values)."""

    def reset_parameters(self) -> None:
        normal_(self.weight)
        if self.padding_idx is not None and not self.weight.is_meta:
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()


def normal_(t: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """nn.init.normal_(t, 0, std), the same draws, except on the meta device: there a tensor has
    no values to draw, and torch's normal_ for it imports the compiler (torch._dynamo), which
    counting a model's parameters on that device (`charlm train`, `sample`, `info`) would pay
    at every start."""
    return t if t.is_meta else nn.init.normal_(t, 0.0, std)
