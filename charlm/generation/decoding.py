"""The GPT's decoders (KV-cached and uncached), `generate`, one id per row per step, and beam
search over a `Decoder` (`search_beams`, which seq2seq shares).

Past the context window a full cache is re-prefilled once from its most recent `block_size // 2`
ids: memory stays bounded, each id costs O(1) forwards amortised. The uncached path crops to
the last `block_size` ids at every step (nanoGPT's): the two agree up to the first full window."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError
from charlm.generation.compiled_step import CompiledStep, compile_failed, decode_one_token
from charlm.generation.sampler import Sampler
from charlm.generation.utf8 import Utf8Mask
from charlm.model.gpt import GPT


class NonFiniteOutput(CharlmError):
    """The logits hold NaN or inf: nothing to sample from (or to score: `use`)."""

    def __init__(self, use: str = "sample from") -> None:
        super().__init__(
            "the model's next-character probabilities are not finite (NaN or inf): its weights "
            f"have diverged; {use} an earlier checkpoint, or train again with a lower optim.lr"
        )


class Decoder(Protocol):
    """What generation and beam search drive (also `seq2seq.Seq2SeqDecoder`); logits (B, V)."""

    def prefill(self, idx: torch.Tensor) -> torch.Tensor: ...
    def step(self, ids: torch.Tensor) -> torch.Tensor: ...
    def reorder(self, index: torch.Tensor) -> None: ...


def refill_length(block: int) -> int:
    """The past-window rule: the ids a full cache is prefilled again from, the new one last."""
    return max(block // 2, 1)


def kept_ids(window: torch.Tensor, block: int) -> torch.Tensor:
    """The ids of a full cache's window (..., block) that the new id follows in its refill."""
    return window[..., block - refill_length(block) + 1:]


class CachedDecoder:
    """Decodes over a preallocated KV cache; `window` mirrors the ids the cache holds, to
    re-prefill a full one from. With `compile`, one-token steps run a `CompiledStep` (prefills
    stay eager: their length varies), or eagerly after one warning where it cannot be built."""

    def __init__(self, model: GPT, batch_size: int, compile: bool = False):
        self.model = model
        self.block = model.cfg.block_size
        self.cache = model.new_cache(batch_size)
        self.window = torch.empty(batch_size, self.block, dtype=torch.long,
                                  device=model.wte.weight.device)
        self.compiled = CompiledStep(model, self.cache) if compile else None

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Start over from idx (B, T), T <= block_size."""
        self.cache.reset()
        self.window[:, : idx.size(1)] = idx
        logits, _ = self.model(idx, cache=self.cache)
        if self.compiled is not None:
            self.compiled.seek(self.cache.pos)
        return logits[:, -1, :]

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """Append one id per row, ids (B,)."""
        pos = self.cache.pos
        if pos == self.block:
            tail = torch.cat([kept_ids(self.window, self.block), ids[:, None]], dim=1)
            return self.prefill(tail)
        self.window[:, pos] = ids
        if self.compiled is not None:
            try:
                logits = self.compiled(ids)  # advances the compiled step's position
                self.cache.pos += 1
                return logits
            except Exception as e:  # the first call builds the graph
                compile_failed(e)
                self.compiled = None
        return decode_one_token(self.model, ids[:, None], self.cache)

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


@torch.inference_mode()
def generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int,
             opts: SampleConfig | None = None,
             generator: torch.Generator | None = None,
             mask: Utf8Mask | None = None) -> Iterator[torch.Tensor]:
    """Yield max_new_tokens tensors of ids (B,), one per step, continuing prompt (B, T0); no
    forward is spent on a step never asked for. A byte model's `mask` keeps rows valid UTF-8."""
    opts = opts or SampleConfig()
    model.eval()
    B = prompt.size(0)
    decoder = CachedDecoder(model, B, opts.compile) if opts.use_cache else UncachedDecoder(model, B)
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


@torch.inference_mode()
def beam_search(model: GPT, prompt: torch.Tensor, max_new_tokens: int, beams: int,
                stops: Sequence[list[int]] = (), use_cache: bool = True, compile: bool = False,
                mask: Utf8Mask | None = None) -> list[int]:
    """The best continuation of prompt (1, T0); a beam ends at any of `stops` (id lists)."""
    model.eval()
    decoder = CachedDecoder(model, beams, compile) if use_cache else UncachedDecoder(model, beams)
    ends = (lambda seq: any(seq[-len(s):] == s for s in stops)) if stops else None
    hyps = search_beams(decoder, prompt[:, -decoder.block:].expand(beams, -1), max_new_tokens,
                        beams, ends, mask)
    return hyps[0][1] if hyps else []


def search_beams(decoder: Decoder, start: torch.Tensor, max_steps: int, beams: int,
                 ends: Callable[[list[int]], bool] | None, mask: Utf8Mask | None = None
                 ) -> list[tuple[float, list[int]]]:
    """(mean log-probability, ids) of the hypotheses from start (beams, T0), best first. One
    that `ends` finishes; the search stops once `beams` have, or after max_steps ids. The
    finished ones count if any did, and after max_steps the live beams too."""
    device = start.device
    scores = torch.full((beams,), float("-inf"), device=device)
    scores[0] = 0.0  # all beams start identical: expand only the first
    seqs: list[list[int]] = [[] for _ in range(beams)]
    finished: list[tuple[float, list[int]]] = []
    last = None
    for t in range(max_steps):
        logits = decoder.prefill(start) if t == 0 else decoder.step(last)
        if mask is not None:
            logits = mask.apply(logits)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        V = logp.size(-1)
        cand_scores, cand = (scores[:, None] + logp).view(-1).topk(min(2 * beams, beams * V))
        keep: list[tuple[int, int, float]] = []  # (row, id, score) of the beams that go on
        for score, flat in zip(cand_scores.tolist(), cand.tolist(), strict=True):
            if math.isnan(score):  # NaN or inf logits (topk ranks NaN first)
                raise NonFiniteOutput
            if score == float("-inf"):
                break
            row, token = divmod(flat, V)
            seq = seqs[row] + [token]
            if ends is not None and ends(seq):
                finished.append((score / len(seq), seq))
            elif len(keep) < beams:
                keep.append((row, token, score))
            if len(keep) == beams:
                break
        if len(finished) >= beams or not keep:
            # the live beams are cut short here: they count only if nothing finished
            break
        keep += [(*keep[0][:2], float("-inf"))] * (beams - len(keep))  # pad with dead beams
        rows, ids, kept = zip(*keep, strict=True)
        index = torch.tensor(rows, device=device)
        decoder.reorder(index)
        last = torch.tensor(ids, device=device)
        if mask is not None:
            mask.select(index)
            mask.advance(last)
        seqs = [seqs[r] + [i] for r, i in zip(rows, ids, strict=True)]
        scores = torch.tensor(kept, device=device)
    else:  # every step ran: the live beams end at max_steps, complete hypotheses too
        finished += _ranked(scores, seqs)
    hyps = finished or _ranked(scores, seqs)
    return sorted(hyps, key=lambda h: h[0], reverse=True)  # stable: ties keep their order


def _ranked(scores: torch.Tensor, seqs: list[list[int]]) -> list[tuple[float, list[int]]]:
    """(mean log-probability, sequence) of each live beam."""
    return [(s / max(len(q), 1), q)
            for s, q in zip(scores.tolist(), seqs, strict=True) if s != float("-inf")]
