"""The compiled one-token decode step (gpt-fast's `decode_one_token`): static shapes and a
device-tensor position, so one graph serves every position and no step waits for the host."""

from __future__ import annotations

import copy
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from charlm.core.errors import first_line, warn
from charlm.model.attention import KVCache
from charlm.model.gpt import GPT


def decode_one_token(model: GPT, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The one-token step, eager or compiled: ids idx (B, 1) at cache.pos -> logits (B, V)."""
    return model(idx, cache=cache)[0][:, -1, :]


@functools.cache
def compiled_decode_step() -> Callable[[GPT, torch.Tensor, KVCache], torch.Tensor]:
    """`decode_one_token` compiled once per process, whole (a graph break fails the build); the
    C++ wrapper calls the kernels without Python between them, most of a small step's cost."""
    return torch.compile(decode_one_token, dynamic=False, fullgraph=True,
                         options={"cpp_wrapper": True})


def compile_failed(e: Exception) -> None:
    """Say once that building the graph failed (no C++ compiler, an op it cannot take)."""
    warn(f"torch.compile failed ({first_line(e)}); decoding without compile")


# what each graph built in this process was built for (it serves every model that matches)
BUILT: set[tuple] = set()
REPS = 10  # timed steps of each kind when a graph is built


class CompiledStep:
    """`compiled_decode_step` over `cache`'s keys and values, through a copy of the cache whose
    position is a device tensor. The call that builds a graph says on stderr how long it took;
    an error there propagates, for the caller to go on eagerly. `model` is left as it was."""

    def __init__(self, model: GPT, cache: KVCache, per_row: bool = False):
        self.model = model
        self.static = copy.copy(cache)  # the same key and value tensors
        B = cache.k[0].size(0)
        # one position for every row, or each row's own (requests of different lengths)
        self.static.pos = torch.zeros((B,) if per_row else (), dtype=torch.long,
                                      device=cache.k[0].device)
        self.step = compiled_decode_step()
        self.key = (repr(model.cfg), model.vocab_size, B, per_row, model.wte.weight.dtype,
                    cache.k[0].device)

    def seek(self, pos: int | Sequence[int]) -> None:
        self.static.pos.copy_(torch.as_tensor(pos))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Append one id per row, ids (B,), at the current position; logits (B, V)."""
        if self.key in BUILT:
            return self.step(self.model, ids[:, None], self.static)
        start = time.perf_counter()
        logits = self.step(self.model, ids[:, None], self.static)
        BUILT.add(self.key)
        built = time.perf_counter() - start
        print(f"compiled the decode step in {built:.1f} s; {self.against_eager(ids)}",
              file=sys.stderr)
        return logits

    def against_eager(self, ids: torch.Tensor) -> str:
        """The graph's step against the eager one, the median of REPS each, interleaved: what
        `--compile` buys on this machine (on some CPUs it costs). Both run at least halfway
        into the cache, where no later step reads before writing; the position is put back."""
        pos = self.static.pos.clone()
        at = pos.clamp(min=self.static.max_len // 2)
        view = self.static.view(slice(None), int(at.max()) + 1)  # the eager step's cache
        took: dict[str, list[float]] = {"compiled": [], "eager": []}
        for _ in range(REPS):
            for name, times in took.items():
                start = time.perf_counter()
                if name == "compiled":
                    self.static.pos.copy_(at)
                    self.step(self.model, ids[:, None], self.static)
                else:
                    view.pos = at.clone() if at.dim() else int(at)
                    self.model(ids[:, None], cache=view)
                times.append(time.perf_counter() - start)
        self.static.pos.copy_(pos)
        compiled, eager = (statistics.median(times) * 1e3 for times in took.values())
        ratio = round(eager / compiled, 2)  # as shown: 1.00x is not called slower
        rows = f"{ids.numel()} row{'s' if ids.numel() > 1 else ''}"
        return (f"a step of {rows} takes {compiled:.2f} ms against eager's {eager:.2f} ms "
                f"({ratio:.2f}x{': slower than eager on this machine' if ratio < 1 else ''})")
