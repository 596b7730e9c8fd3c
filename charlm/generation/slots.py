"""`SlotDecoder`: the rows of one KV cache as independent sequences, each at its own position,
decoded one token per row per step (continuous batching: `charlm serve`'s engine).

Rows 0..n-1 are live. A sequence is added by a prefill of its row alone and leaves by moving the
last live row into its place, so a step always decodes the prefix of rows 0..n-1 (a view: no
copy). Each row follows `decoding.CachedDecoder`'s past-window rule on its own: when its cache is
full, the most recent `block_size // 2` ids are re-prefilled, so each row's greedy ids equal
`decoding.generate`'s for its prompt alone (up to the rounding of a batched product).
"""

from __future__ import annotations

import torch

from charlm.core.errors import first_line, warn
from charlm.generation.compiled_step import CompiledStep
from charlm.generation.decoding import kept_ids
from charlm.model.gpt import GPT


class SlotDecoder:
    """`slots` rows of a KV cache whose positions (`pos`, on the host) are each row's own.

    A step decodes the live rows over their longest context only; with `compile` and more
    than half the slots live, it runs one `CompiledStep` graph over every slot instead (live or
    not: static shapes), built by `build`. Below that the graph's idle rows would cost more
    than eager steps of the live ones.
    """

    def __init__(self, model: GPT, slots: int, compile: bool = False):
        self.model = model
        self.slots = slots
        self.block = model.cfg.block_size
        self.cache = model.new_cache(slots)
        self.device = model.wte.weight.device
        # the ids whose keys and values sit in each row, to re-prefill a full row from
        self.window = torch.zeros(slots, self.block, dtype=torch.long, device=self.device)
        self.pos: list[int] = []  # of the live rows
        self.compiled = CompiledStep(model, self.cache, per_row=True) if compile else None

    @property
    def n(self) -> int:
        return len(self.pos)

    def build(self) -> None:
        """Build the compiled step's graph now (one step over empty slots). Where it cannot be
        built, one warning and eager steps from then on."""
        if self.compiled is None:
            return
        try:
            self.compiled.seek([0] * self.slots)
            self.compiled(torch.zeros(self.slots, dtype=torch.long, device=self.device))
        except Exception as e:  # no C++ compiler, an op the compiler cannot take, ...
            warn(f"torch.compile failed ({first_line(e)}); decoding without compile")
            self.compiled = None

    def add(self, ids: list[int]) -> torch.Tensor:
        """Start a sequence in row n from ids (its last block_size), prefilled alone; the
        logits (V,) of its next id."""
        ids = ids[-self.block:]
        self.pos.append(0)
        try:
            return self._prefill(self.n - 1, torch.tensor(ids, device=self.device))
        except BaseException:  # the row never became live
            self.pos.pop()
            raise

    def _prefill(self, row: int, ids: torch.Tensor) -> torch.Tensor:
        """Fill `row` from ids (T,) at positions 0..T-1; the logits (V,) after the last."""
        T = ids.numel()
        self.window[row, :T] = ids
        view = self.cache.view(slice(row, row + 1))
        view.pos = 0
        logits, _ = self.model(ids[None], cache=view)
        self.pos[row] = T
        return logits[0, -1]

    def remove(self, row: int) -> None:
        """Row `row` leaves; the last live row moves into it (the caller moves what it keeps
        per row the same way)."""
        last = self.n - 1
        if row != last:
            self.cache.copy_row(last, row)
            self.window[row] = self.window[last]
            self.pos[row] = self.pos[last]
        self.pos.pop()

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Append one id per live row, ids (n,); the logits (n, V) of their next ids."""
        n = self.n
        for row in range(n):
            if self.pos[row] == self.block:  # full: keep the most recent ids, as CachedDecoder
                kept = kept_ids(self.window[row], self.block).clone()  # and ids[row]
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
            logits = self.model(ids[:, None], cache=view)[0][:, -1]
        self.pos = [p + 1 for p in self.pos]
        return logits
