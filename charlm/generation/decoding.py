"""Generation over token ids: decoders (KV-cached and uncached), logits processors,
`sample_next`, the `generate` iterator that streams one id per sample per step, and
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

import math
from collections.abc import Callable, Iterator, Sequence
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
        self.keep = max(self.block // 2, 1)
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
            tail = torch.cat([self.window[:, pos - self.keep + 1:], ids[:, None]], dim=1)
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


def apply_repetition_penalty(logits: torch.Tensor, recent: torch.Tensor,
                             penalty: float) -> torch.Tensor:
    """Make ids that occur in recent (B, W) less likely: positive logits are divided by
    `penalty`, negative ones multiplied (CTRL, Keskar et al. 2019). Entries of -1 are empty."""
    V = logits.size(-1)
    seen = torch.zeros(logits.size(0), V + 1, dtype=torch.bool, device=logits.device)
    seen.scatter_(1, recent.masked_fill(recent < 0, V), True)
    # A tiny penalty can overflow a positive logit to +inf (softmax would make it NaN): the
    # largest finite float keeps the limit's meaning, the seen ids win.
    big = torch.finfo(logits.dtype).max
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty).clamp(-big, big)
    return torch.where(seen[:, :V], penalised, logits)


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature, shifted so the largest is 0 (softmax does not change): a tiny
    temperature then sends the others to -inf rather than the likeliest ones to +inf.

    Written as a product with 1 / temperature, which is how CUDA divides a tensor by a number:
    for a temperature below the dtype's smallest normal number (float32: 2**-126) that factor
    would be inf, and the largest logit 0 * inf = NaN. Such temperatures use that smallest
    number instead, the same limit, so every device computes the same thing."""
    scale = 1.0 / max(temperature, torch.finfo(logits.dtype).tiny)
    return (logits - logits.amax(dim=-1, keepdim=True)) * scale


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the rest to -inf. Logits tied with the k-th
    stay too (as nanoGPT's and Hugging Face's top-k do), so a tie never depends on the order."""
    if top_k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of likeliest ids whose probability mass is >= top_p."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of the strictly likelier ids
    drop_sorted = mass_before >= top_p
    drop_sorted[:, 0] = False  # the likeliest always stays, also where top_p is 0 in float32
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop ids whose probability is below min_p times that of the likeliest id."""
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p * probs.max(dim=-1, keepdim=True).values
    return logits.masked_fill(probs < threshold, float("-inf"))


Processor = Callable[[torch.Tensor], torch.Tensor]


def warpers(opts: SampleConfig, mask: Utf8Mask | None = None) -> list[Processor]:
    """What makes the distribution a character is drawn from (and scored by), after the
    repetition penalty: the temperature, then a byte model's UTF-8 mask. The mask comes after:
    a huge temperature's factor is 0 in float32, and 0 times the mask's -inf is NaN."""
    procs: list[Processor] = []
    if opts.temperature not in (0, 1.0):
        procs.append(lambda x: apply_temperature(x, opts.temperature))
    if mask is not None:
        procs.append(mask.apply)
    return procs


def build_processors(opts: SampleConfig, mask: Utf8Mask | None = None) -> list[Processor]:
    """The processors after the repetition penalty, in order: `warpers`, then top-k, top-p
    and min-p (`truncations`; none for greedy)."""
    return warpers(opts, mask) + truncations(opts)


def truncations(opts: SampleConfig) -> list[Processor]:
    """The processors that cut the distribution's tail: top-k, top-p, min-p; none for greedy."""
    if opts.temperature == 0:
        return []
    procs: list[Processor] = []
    if opts.top_k is not None:
        procs.append(lambda x: apply_top_k(x, opts.top_k))
    if opts.top_p is not None and opts.top_p < 1.0:
        procs.append(lambda x: apply_top_p(x, opts.top_p))
    if opts.min_p:
        procs.append(lambda x: apply_min_p(x, opts.min_p))
    return procs


def sample_next(logits: torch.Tensor, temperature: float, procs: Sequence[Processor] = (),
                generator: torch.Generator | None = None) -> torch.Tensor:
    """The next id per row of logits (B, V), after `procs`: argmax for temperature 0, else a
    draw from the softmax."""
    logits = logits.float()
    for proc in procs:
        logits = proc(logits)
    # Each check reads one number per row on the host (fewer ops than torch.isfinite): one
    # host sync per token, which streaming the token makes anyway.
    if temperature == 0:
        best, ids = logits.max(dim=-1)  # the first of tied ids, as argmax; a NaN row: the NaN
        if not all(map(math.isfinite, best.tolist())):
            raise NonFiniteOutput
        return ids
    probs = torch.softmax(logits, dim=-1)
    # CUDA's multinomial draws from NaN rows without a word (the CPU's raises). Probabilities
    # lie in [0, 1] unless NaN, so a row's sum is finite exactly when all of them are.
    if not all(map(math.isfinite, probs.sum(dim=-1).tolist())):
        raise NonFiniteOutput
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


class RecentIds:
    """The last W ids of each row, for the repetition penalty: a ring buffer `ids` (B, W),
    -1 in empty slots. W is at most the number of ids there will ever be (`total`), so a huge
    --repetition-window costs nothing."""

    def __init__(self, start: torch.Tensor, window: int, total: int):
        W = max(min(window, total), 1)
        self.ids = torch.full((start.size(0), W), -1, dtype=torch.long, device=start.device)
        tail = start[:, -W:]  # start (B, T0): the ids before the first new one (the prompt)
        self.ids[:, : tail.size(1)] = tail
        self.slot = tail.size(1) % W

    def push(self, ids: torch.Tensor) -> None:
        """Append one id per row, ids (B,)."""
        self.ids[:, self.slot] = ids
        self.slot = (self.slot + 1) % self.ids.size(1)

    def select(self, index: torch.Tensor) -> None:
        """Keep rows index (B',), in that order."""
        self.ids = self.ids[index]


@torch.inference_mode()
def generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int,
             opts: SampleConfig | None = None,
             generator: torch.Generator | None = None,
             mask: Utf8Mask | None = None) -> Iterator[torch.Tensor]:
    """Yield max_new_tokens tensors of ids (B,), one per step, continuing prompt (B, T0).

    A prompt longer than block_size is cropped to its last block_size tokens. One forward per
    step for the whole batch; no forward is spent on a step that is never asked for. A byte
    model's `mask` keeps each row's bytes valid UTF-8 (after the repetition penalty, whose
    clamp would make its -inf finite, and the temperature: `warpers`).
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
