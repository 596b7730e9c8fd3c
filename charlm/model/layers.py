"""torch's layers with a cheaper call and attribute read, for the models' decode hot path, a
`Linear` whose float32 product with a few rows by a large weight on the CPU uses every thread
(`split_product`), and `maybe_dropout`, which skips dropout's call where it does nothing.

`nn.Module` keeps submodules and parameters in registries (`_modules`, `_parameters`) and finds
them through `__getattr__`, which Python calls only after the ordinary look-up has failed; its
`__call__` runs two frames of hook bookkeeping before `forward`. A decode step does a few hundred
of each, a tenth of eager decode time (docs/benchmarks-log.md). Here a class names its children
(`child()`, `param()`) so a read is one dict look-up in torch's own registry, and `Module.__call__`
goes straight to `forward` when no hook, compiled call or tracer could see the call. Everything
else (registration, `state_dict`, hooks, `to`, `compile`) is `nn.Module`'s, unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules import module as _hooks


class child:
    """A class attribute for a registered submodule: `self.attn` reads `self._modules["attn"]`.

    A non-data descriptor, so `nn.Module.__setattr__` / `__delattr__` still own the registry and
    reading always sees what it holds (an unregistered name raises AttributeError, as before).
    """

    __slots__ = ("name",)
    registry = "_modules"

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        try:
            return obj.__dict__[self.registry][self.name]
        except KeyError:
            raise AttributeError(self.name) from None  # nn.Module.__getattr__ says it in full


class param(child):
    """A class attribute for a registered parameter (or a parameter slot set to None)."""

    __slots__ = ()
    registry = "_parameters"


class Module(nn.Module):
    """`nn.Module` whose call skips torch's hook bookkeeping when there is nothing to run."""

    def __call__(self, *args, **kwargs):
        # torch's own call has work to do for a hook (the module's or a global one),
        # `module.compile()` or `torch.jit.trace`; otherwise it would only call forward.
        # The module's own slots are read from its __dict__ in one go (this runs about 60
        # times a decode step).
        own = self.__dict__
        if (own["_forward_hooks"] or own["_forward_pre_hooks"] or own["_backward_hooks"]
                or own["_backward_pre_hooks"] or own.get("_compiled_call_impl") is not None
                or _hooks._global_forward_hooks or _hooks._global_forward_pre_hooks
                or _hooks._global_backward_hooks or _hooks._global_backward_pre_hooks
                or torch._C._get_tracing_state()):
            return super().__call__(*args, **kwargs)
        return self.forward(*args, **kwargs)


def threads() -> int:
    """torch's thread count, which torch.compile takes as a constant (a call to
    `torch.get_num_threads` in a graph breaks it). A compiled graph keeps the count it was
    traced with: another count changes only how its products are split, not their result."""
    return torch.get_num_threads()


# What `torch.compiler.assume_constant_result` sets (a test checks it), without its import of
# torch._dynamo, which would add 1.8 s to every command's start on the EPYC.
threads._dynamo_marked_constant = True  # type: ignore[attr-defined]


SPLIT_ROWS = 64  # up to this many rows, `split_product` beats F.linear (timed to 256)


# From this many values in a weight (512 KiB of float32) the split can win; below it, the threads'
# start and join cost more than the product (a row by a 96 x 32 weight: 21.5 against 8.1 us).
SPLIT_MIN_WEIGHTS = 1 << 17


class Linear(Module, nn.Linear):
    """`nn.Linear`, whose float32 product on the CPU with a few rows (a decode step, a small
    batch of samples or beams) by a large weight, outside autograd, is split over the threads
    (`split_product`), eagerly or in a compiled graph."""

    weight, bias = param(), param()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if torch.is_grad_enabled() or w.dtype is not torch.float32 or not w.is_cpu:
            return F.linear(x, w, self.bias)  # training leaves at the first test
        N, K = w.shape
        parts = math.gcd(N, threads())
        if (parts == 1 or N * K < SPLIT_MIN_WEIGHTS or x.numel() > SPLIT_ROWS * K
                or x.shape[-1] != K or not w.is_contiguous()):
            return F.linear(x, w, self.bias)
        return split_product(x, w, self.bias, parts)


def split_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                  parts: int) -> torch.Tensor:
    """F.linear(x, w, bias) for x (..., K) of M rows, w (N, K): w's rows in `parts` equal
    blocks, one batched product (N / parts, K) @ (K, M) per block.

    MKL computes a product with few rows on one core (on the EPYC a pass over the baby GPT's
    weights with one row took 4.2 ms with one thread or two). As a batched product it runs a
    block per thread: with one row, 16-17.5 against 9-12.5 GB/s from memory for the model's
    four weight shapes, a float32 decode step about 20 % faster; with 2-64 rows, 1.4-2.4x
    faster products; with 256 rows 1.14x; from 1024 rows none (docs/benchmarks-log.md). The sums
    are the same dot products, so the result matches F.linear's within rounding. Half
    precision is left to F.linear, which was faster for it."""
    N, K = w.shape
    M = x.numel() // K
    blocks = w.view(parts, N // parts, K)
    if M == 1 and x.is_contiguous():  # a decode step: the fewest ops (each costs microseconds)
        y = torch.bmm(blocks, x.as_strided((parts, K, 1), (0, 1, K)))  # (parts, N / parts, 1)
        y = y.view(*x.shape[:-1], N)  # (unpacked: a torch.Size argument parses 2.5x slower)
    else:
        columns = x.reshape(M, K).t().expand(parts, K, M)  # strides MKL takes as a transpose
        y = torch.bmm(blocks, columns).permute(2, 0, 1).reshape(*x.shape[:-1], N)
    return y if bias is None else y.add_(bias)


def maybe_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, minus the call when it is the identity (decoding runs this per layer per
    token)."""
    return F.dropout(x, p, training) if training and p > 0 else x


class LayerNorm(Module, nn.LayerNorm):
    weight, bias = param(), param()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # F.layer_norm's call, minus its checks
        return torch.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class Embedding(Module, nn.Embedding):
    weight = param()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # F.embedding's call, minus its checks
        if self.max_norm is not None:  # renormalizes rows in place: F.embedding's own path
            return super().forward(idx)
        padding = -1 if self.padding_idx is None else self.padding_idx
        return torch.embedding(self.weight, idx, padding, self.scale_grad_by_freq, self.sparse)

    def reset_parameters(self) -> None:  # nn.Embedding's, by `normal_`
        normal_(self.weight)
        self._fill_padding_idx_with_zero()


def normal_(t: torch.Tensor, std: float = 1.0) -> torch.Tensor:
    """nn.init.normal_(t, 0, std), the same draws, except on the meta device: there a tensor
    has no values to draw, and torch's normal_ for it imports torch._dynamo, 1.8 s on the EPYC,
    which `charlm sample` and `info` paid at start for counting parameters on that device."""
    return t if t.is_meta else nn.init.normal_(t, 0.0, std)
