"""Generation over token ids: decoders (KV-cached and uncached), the `generate` iterator
that streams one id per sample per step (drawn by `charlm.generation.sampler`), and
`beam_search` over the one beam search core, `search_beams`, which the encoder-decoder's
`charlm.generation.seq2seq` shares. Text (prompts, stop strings, streaming) is
`charlm.generation.text`'s.

Past the context window (cached path): when the cache is full, the most recent
`block_size // 2` tokens are kept and re-prefilled in one forward, so each new token costs O(1)
forward passes amortised and memory stays bounded. Up to the first full window the tokens equal
the uncached path's, which crops the context to its last `block_size` tokens at every step
(nanoGPT's rule); past it the two see different contexts and may differ.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError, first_line, warn
from charlm.generation.compiled_step import CompiledStep
from charlm.generation.sampler import Sampler
from charlm.generation.utf8 import Utf8Mask
from charlm.model.gpt import GPT


class NonFiniteOutput(CharlmError):
    """The model's logits hold NaN or inf, so there is nothing to sample from (or to score:
    `use` says which)."""

    def __init__(self, use: str = "sample from") -> None:
        super().__init__(
            "the model's next-character probabilities are not finite (NaN or inf): its weights "
            f"have diverged; {use} an earlier checkpoint, or train again with a lower optim.lr"
        )


class Decoder(Protocol):
    """What generation and beam search drive: the GPT's decoders here, and
    `seq2seq.Seq2SeqDecoder` over an encoded source. Logits are (B, V) for the next position."""

    def prefill(self, idx: torch.Tensor) -> torch.Tensor: ...
    def step(self, ids: torch.Tensor) -> torch.Tensor: ...
    def reorder(self, index: torch.Tensor) -> None: ...


def refill_length(block: int) -> int:
    """The past-window rule: a full cache is prefilled again from its most recent
    refill_length(block) ids, the new one last: half the context (at least the new id)."""
    return max(block // 2, 1)


def kept_ids(window: torch.Tensor, block: int) -> torch.Tensor:
    """The ids of a full cache's window (..., block) that the new id follows in its refill."""
    return window[..., block - refill_length(block) + 1:]


class CachedDecoder:
    """Feeds tokens through the model over a preallocated KV cache.

    `window` mirrors the ids whose keys and values sit in the cache, so a full cache can be
    re-prefilled from its most recent half without keeping the whole history.

    With `compile`, each one-token step runs a `CompiledStep` over the same cache (one graph
    for every position; no step waits for the host). Prefills stay eager (their length
    varies). Where the graph cannot be built, decoding goes on eagerly after one warning.
    """

    def __init__(self, model: GPT, batch_size: int, compile: bool = False):
        self.model = model
        self.block = model.cfg.block_size
        self.cache = model.new_cache(batch_size)
        self.window = torch.empty(batch_size, self.block, dtype=torch.long,
                                  device=model.wte.weight.device)
        self.compiled = CompiledStep(model, self.cache) if compile else None

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Start over from idx (B, T), T <= block_size, in one forward; logits (B, V)."""
        self.cache.reset()
        self.window[:, : idx.size(1)] = idx
        logits, _ = self.model(idx, cache=self.cache)
        if self.compiled is not None:
            self.compiled.seek(self.cache.pos)
        return logits[:, -1, :]

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Append one id per row, ids (B,); logits (B, V) for the next position."""
        pos = self.cache.pos
        if pos == self.block:  # full: keep the most recent tokens, re-prefill once
            tail = torch.cat([kept_ids(self.window, self.block), ids[:, None]], dim=1)
            return self.prefill(tail)
        self.window[:, pos] = ids
        if self.compiled is not None:
            try:
                logits = self.compiled(ids)  # advances the compiled step's position
                self.cache.pos += 1
                return logits
            except Exception as e:  # the first call builds the graph: no compiler, an op, ...
                warn(f"torch.compile failed ({first_line(e)}); decoding without compile")
                self.compiled = None
        logits, _ = self.model(ids[:, None], cache=self.cache)
        return logits[:, -1, :]

    def reorder(self, index: torch.Tensor) -> None:
        """Make row i continue from row index[i] (beam search)."""
        pos = self.cache.pos
        for k, v in zip(self.cache.k, self.cache.v, strict=True):
            k[:, :, :pos] = k[index, :, :pos]
            v[:, :, :pos] = v[index, :, :pos]
        self.window[:, :pos] = self.window[index, :pos]


class UncachedDecoder:
    """The reference path: recompute the whole (cropped) context at every step."""

    def __init__(self, model: GPT, batch_size: int):
        self.model = model
        self.block = model.cfg.block_size
        self.context = torch.empty(batch_size, 0, dtype=torch.long)

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        self.context = idx
        logits, _ = self.model(idx)
        return logits[:, -1, :]

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        return self.prefill(torch.cat([self.context, ids[:, None]], dim=1)[:, -self.block:])

    def reorder(self, index: torch.Tensor) -> None:
        self.context = self.context[index]


def make_decoder(model: GPT, batch_size: int, use_cache: bool,
                 compile: bool = False) -> CachedDecoder | UncachedDecoder:
    if use_cache:
        return CachedDecoder(model, batch_size, compile)
    return UncachedDecoder(model, batch_size)


@torch.inference_mode()
def generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int,
             opts: SampleConfig | None = None,
             generator: torch.Generator | None = None,
             mask: Utf8Mask | None = None) -> Iterator[torch.Tensor]:
    """Yield max_new_tokens tensors of ids (B,), one per step, continuing prompt (B, T0).

    A prompt longer than block_size is cropped to its last block_size tokens. One forward per
    step for the whole batch; no forward is spent on a step that is never asked for. A byte
    model's `mask` keeps each row's bytes valid UTF-8 (`Sampler.warp` says where it applies).
    """
    opts = opts or SampleConfig()
    model.eval()
    decoder = make_decoder(model, prompt.size(0), opts.use_cache, opts.compile)
    sampler = Sampler(min(opts.repetition_window, prompt.size(1) + max_new_tokens),
                      prompt.device, mask, generator)
    sampler.add(opts, prompt)  # the prompt counts as recent too
    nxt = None
    for i in range(max_new_tokens):
        logits = decoder.prefill(prompt[:, -decoder.block:]) if i == 0 else decoder.step(nxt)
        nxt, _, ok, _ = sampler.step(logits)
        if not all(ok):
            raise NonFiniteOutput
        yield nxt
