"""What the models add to torch's layers: a `Linear` whose decode layout (`charlm.runtime.profile`
chooses it) may split its products over the threads, for a BLAS that runs them on one core, and
an `Embedding` whose initial draw skips the meta device."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

SPLIT_ROWS = 64  # up to this many rows a split product can beat F.linear
# below this many values in a weight, the threads' start and join cost more than the product
SPLIT_MIN_WEIGHTS = 1 << 17


class Linear(nn.Linear):
    """`nn.Linear` whose decode-step products may be split over `split_parts` threads."""

    split_parts = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return product(x, self.weight, self.bias, self.split_parts)


def product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
            parts: int) -> torch.Tensor:
    """F.linear(x, w, bias), split over `parts` threads for a few rows by a large row-major
    float32 CPU weight, outside autograd and outside a compiled graph."""
    if (parts == 1 or torch.is_grad_enabled() or w.dtype is not torch.float32 or not w.is_cpu
            or torch.compiler.is_compiling()):
        return F.linear(x, w, bias)  # training leaves at the first tests
    N, K = w.shape
    if (N % parts or N * K < SPLIT_MIN_WEIGHTS or x.numel() > SPLIT_ROWS * K
            or x.shape[-1] != K or not w.is_contiguous()):
        return F.linear(x, w, bias)
    return split_product(x, w, bias, parts)


def split_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                  parts: int) -> torch.Tensor:
    """F.linear(x, w, bias) for x (..., K) of M rows, w (N, K), as one batched product over
    `parts` blocks of w's rows, which BLAS runs a block a thread: equal within rounding."""
    N, K = w.shape
    M = x.numel() // K
    blocks = w.view(parts, N // parts, K)
    if M == 1 and x.is_contiguous():  # a decode step: the fewest ops
        y = torch.bmm(blocks, x.as_strided((parts, K, 1), (0, 1, K)))  # (parts, N / parts, 1)
        y = y.view(*x.shape[:-1], N)
    else:
        columns = x.reshape(M, K).t().expand(parts, K, M)  # strides BLAS takes as a transpose
        y = torch.bmm(blocks, columns).permute(2, 0, 1).reshape(*x.shape[:-1], N)
    return y if bias is None else y.add_(bias)


def decoding_linears(model: nn.Module) -> list[Linear]:
    """`model`'s `Linear`s with a large row-major float32 CPU weight: what a layout changes."""
    return [m for m in model.modules() if isinstance(m, Linear)
            and m.weight.dtype is torch.float32 and m.weight.is_cpu
            and m.weight.numel() >= SPLIT_MIN_WEIGHTS and m.weight.is_contiguous()]


def lay_out_for_decoding(model: nn.Module, split_parts: int, column_major: bool) -> int:
    """Split `decoding_linears` over gcd(out features, split_parts) threads, or store them
    column-major (not contiguous, so unsavable: for a model that only decodes); the count."""
    linears = decoding_linears(model)
    for m in linears:
        m.split_parts = 1 if column_major else math.gcd(m.weight.shape[0], split_parts)
    weights = {id(m.weight): m.weight for m in linears}
    if column_major:
        with torch.no_grad():
            for w in weights.values():
                w.data = w.data.t().contiguous().t()
    return len(weights)


def maybe_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, minus the call when it is the identity."""
    return F.dropout(x, p, training) if training and p > 0 else x


class Embedding(nn.Embedding):
    """`nn.Embedding` that draws its initial weights by `normal_`."""

    def reset_parameters(self) -> None:
        normal_(self.weight)
        if self.padding_idx is not None and not self.weight.is_meta:
            with torch.no_grad():
                self.weight[self.padding_idx].zero_()


def normal_(t: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """nn.init.normal_(t, 0, std), but nothing on the meta device, where torch's would import
    the compiler (torch._dynamo) at every start that counts a model's parameters."""
    return t if t.is_meta else nn.init.normal_(t, 0.0, std)
