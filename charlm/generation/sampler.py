"""`Sampler`: the per-row sampling state every decoder and the serving engine share, drawn in one
batched step with one host sync (nano-vllm's). A row draws one uniform number a step from its own
generator, so a seed gives the same ids alone or in a crowd."""

from __future__ import annotations

import torch

from charlm.config.sampling import SampleConfig
from charlm.generation.utf8 import Utf8Mask

INF = float("inf")


class Sampler:
    """Rows 0..n-1 (`remove` moves the last row into the gap, as `SlotDecoder` does). `window`:
    the recent ids the repetition penalty looks at; `generator`: of rows added without one."""

    def __init__(self, window: int, device: torch.device | str,
                 mask: Utf8Mask | None = None, generator: torch.Generator | None = None):
        self.window = max(window, 1)
        self.device = device
        self.mask = mask
        if mask is not None:  # its rows are this sampler's
            mask.state = mask.state[:0]
        self.generator = generator
        self.opts: list[SampleConfig] = []
        self.generators: list[torch.Generator | None] = []
        self.recent = torch.empty(0, self.window, dtype=torch.long, device=device)
        self.slot = torch.empty(0, dtype=torch.long, device=device)
        self.params: dict[str, torch.Tensor] | None = None  # per-row options, rebuilt on change

    def __len__(self) -> int:
        return len(self.opts)

    def add(self, opts: SampleConfig, prompt: torch.Tensor,
            generator: torch.Generator | None = None) -> None:
        """Add rows continuing prompt (R, T0), each with `opts` and `generator`."""
        R = prompt.size(0)
        tail = prompt[:, -self.window:]
        recent = torch.full((R, self.window), -1, dtype=torch.long, device=self.device)
        recent[:, : tail.size(1)] = tail
        self.recent = torch.cat([self.recent, recent])
        self.slot = torch.cat([self.slot, torch.full((R,), tail.size(1) % self.window,
                                                     dtype=torch.long, device=self.device)])
        if self.mask is not None:  # a prompt is whole characters
            self.mask.state = torch.cat([self.mask.state, self.mask.state.new_zeros(R)])
        self.opts += [opts] * R
        self.generators += [generator] * R
        self.params = None

    def remove(self, row: int) -> None:
        index = list(range(len(self)))
        index[row] = index[-1]
        self.keep(index[:-1])

    def keep(self, index: list[int]) -> None:
        at = torch.tensor(index, dtype=torch.long, device=self.device)
        self.recent, self.slot = self.recent[at], self.slot[at]
        if self.mask is not None:
            self.mask.state = self.mask.state[at]
        self.opts = [self.opts[i] for i in index]
        self.generators = [self.generators[i] for i in index]
        self.params = None

    def _params(self) -> dict[str, torch.Tensor]:
        if self.params is None:
            V = 1 << 62  # no top-k
            cols = {
                "temperature": [o.temperature for o in self.opts],
                "penalty": [o.repetition_penalty for o in self.opts],
                "top_k": [o.top_k or V for o in self.opts],
                "top_p": [INF if o.top_p is None or o.top_p >= 1.0 else o.top_p
                          for o in self.opts],
                "min_p": [o.min_p or 0.0 for o in self.opts],
            }
            self.params = {k: torch.tensor(v, device=self.device) for k, v in cols.items()}
        return self.params

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits (B, V) each row draws from and is scored by: the repetition penalty (CTRL),
        the temperature, then the UTF-8 mask (a huge temperature's 0 times -inf is NaN)."""
        p = self._params()
        x = logits.float()
        if any(o.repetition_penalty != 1.0 for o in self.opts):
            V = x.size(-1)
            seen = torch.zeros(x.size(0), V + 1, dtype=torch.bool, device=x.device)
            seen.scatter_(1, self.recent.masked_fill(self.recent < 0, V), True)
            pen = p["penalty"][:, None]
            # a tiny penalty can overflow a positive logit to +inf: the largest finite float
            big = torch.finfo(x.dtype).max
            penalised = torch.where(x > 0, x / pen, x * pen).clamp(-big, big)
            x = torch.where(seen[:, :V] & (pen != 1.0), penalised, x)
        # the largest shifted to 0 (a tiny temperature sends the others to -inf), times 1 / t
        # (t at least the smallest normal), as CUDA divides, so no row depends on the others
        t = p["temperature"]
        scale = torch.where(t == 0, 1.0, 1.0 / t.clamp(min=torch.finfo(x.dtype).tiny))
        x = (x - x.amax(dim=-1, keepdim=True)) * scale[:, None]
        if self.mask is not None:
            x = self.mask.apply(x)
        return x

    def step(self, logits: torch.Tensor
             ) -> tuple[torch.Tensor, list[int], list[bool], torch.Tensor]:
        """Draw each row's next id from logits (B, V): (ids (B,), the same as a list, whether
        each row was finite, the warped logits). Temperature 0 is argmax (the first of ties)."""
        x = self.warp(logits)
        ids = x.argmax(dim=-1)
        if any(o.temperature != 0 for o in self.opts):
            ids = torch.where(self._params()["temperature"] == 0, ids, self._draw(x))
        # NaN or +inf anywhere makes a row's max not finite: nothing to sample from
        ok = x.amax(dim=-1).isfinite()
        out = torch.stack([ids, ok.long()]).tolist()  # the step's one host sync
        if self.mask is not None:
            self.mask.advance(ids)
        if any(o.repetition_penalty != 1.0 for o in self.opts):
            rows = torch.arange(len(self), device=self.recent.device)
            self.recent[rows, self.slot] = ids
            self.slot = (self.slot + 1) % self.window
        return ids, out[0], [bool(f) for f in out[1]], x

    def _draw(self, x: torch.Tensor) -> torch.Tensor:
        """One id per row (B,) from softmax(x) after top-k (ties stay), top-p and min-p."""
        p = self._params()
        x, order = torch.sort(x, dim=-1, descending=True, stable=True)
        k = p["top_k"].clamp(max=x.size(-1))[:, None] - 1
        x = x.masked_fill(x < x.gather(1, k), -INF)
        probs = torch.softmax(x, dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= p["top_p"][:, None]
        drop |= probs < p["min_p"][:, None] * probs[:, :1]
        drop[:, 0] = False  # the likeliest always stays
        probs = probs.masked_fill(drop, 0.0)
        if any(g is not None for g in self.generators):
            u = torch.cat([torch.rand(1, generator=g or self.generator, device=x.device)
                           for g in self.generators])
        else:
            u = torch.rand(x.size(0), generator=self.generator, device=x.device)
        cdf = probs.cumsum(dim=-1)
        pick = (cdf <= u[:, None] * cdf[:, -1:]).sum(dim=-1)
        # u * total can round up to total: the last id of nonzero probability at most
        pick = torch.minimum(pick, (probs > 0).long().cumsum(dim=-1).argmax(dim=-1))
        return order.gather(1, pick[:, None])[:, 0]
