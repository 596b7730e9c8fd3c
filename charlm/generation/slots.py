"""`SlotDecoder`: one KV cache's rows as sequences at their own positions (continuous batching)."""

from __future__ import annotations

import torch

from charlm.generation.compiled_step import CompiledStep, compile_failed, decode_one_token
from charlm.generation.decoding import kept_ids
from charlm.model.gpt import GPT


class SlotDecoder:
    """A sequence joins by a prefill of its row alone and leaves by moving the last live row into
    its place; each keeps the past-window rule, so its greedy ids are `generate`'s for its prompt
    alone (up to a batched product's rounding). A step decodes the live rows 0..n-1 over their
    longest context; with `compile` and over half the slots live, one `CompiledStep` graph over
    every slot (static shapes: below half, its idle rows would cost more than eager steps)."""

    def __init__(self, model: GPT, slots: int, compile: bool = False):
        self.model = model
        self.slots = slots
        self.block = model.cfg.block_size
        self.cache = model.new_cache(slots)
        self.device = model.wte.weight.device
        # the ids each row's cache holds, to re-prefill a full row from
        self.window = torch.zeros(slots, self.block, dtype=torch.long, device=self.device)
        self.pos: list[int] = []  # of the live rows
        self.compiled = CompiledStep(model, self.cache, per_row=True) if compile else None

    @property
    def n(self) -> int:
        return len(self.pos)

    def build(self) -> None:
        """Build the compiled step's graph now (a step over empty slots), or go on eagerly."""
        if self.compiled is None:
            return
        try:
            self.compiled.seek([0] * self.slots)
            self.compiled(torch.zeros(self.slots, dtype=torch.long, device=self.device))
        except Exception as e:
            compile_failed(e)
            self.compiled = None

    def add(self, ids: list[int]) -> torch.Tensor:
        """Start a sequence in row n from ids (its last block_size); the logits (V,) after it."""
        ids = ids[-self.block:]
        self.pos.append(0)
        try:
            return self._prefill(self.n - 1, torch.tensor(ids, device=self.device))
        except BaseException:  # the row never became live
            self.pos.pop()
            raise

    def _prefill(self, row: int, ids: torch.Tensor) -> torch.Tensor:
        """Fill `row` from ids (T,) at positions 0..T-1; the logits (V,) after them."""
        T = ids.numel()
        self.window[row, :T] = ids
        view = self.cache.view(slice(row, row + 1))
        view.pos = 0
        logits, _ = self.model(ids[None], cache=view)
        self.pos[row] = T
        return logits[0, -1]

    def remove(self, row: int) -> None:
        """Row `row` leaves; the last live row moves into it (the caller's rows must too)."""
        last = self.n - 1
        if row != last:
            self.cache.copy_row(last, row)
            self.window[row] = self.window[last]
            self.pos[row] = self.pos[last]
        self.pos.pop()

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Append one id per live row, ids (n,); logits (n, V)."""
        n = self.n
        for row in range(n):
            if self.pos[row] == self.block:  # full: re-prefill, then ids[row] follows
                kept = kept_ids(self.window[row], self.block).clone()
                if kept.numel():
                    self._prefill(row, kept)
                else:  # block_size 1: only the new id
                    self.pos[row] = 0
        rows = torch.arange(n, device=self.device)
        at = torch.tensor(self.pos, device=self.device)
        self.window[rows, at] = ids
        if self.compiled is not None and n > self.slots // 2:
            self.compiled.seek(self.pos + [0] * (self.slots - n))  # idle slots write at 0
            padded = torch.zeros(self.slots, dtype=torch.long, device=self.device)
            padded[:n] = ids
            logits = self.compiled(padded)[:n]
        else:  # the live rows over the longest of their contexts
            view = self.cache.view(slice(0, n), max(self.pos) + 1)
            view.pos = at
            logits = decode_one_token(self.model, ids[:, None], view)
        self.pos = [p + 1 for p in self.pos]
        return logits
