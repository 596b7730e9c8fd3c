"""Generation: decoders (KV-cached and uncached), logits processors, the `generate` iterator
that streams one id per sample per step, `beam_search`, and `sample_text`, which turns a prompt
string into finished samples with stop strings and streaming callbacks.

Past the context window (cached path): when the cache is full, the most recent
`block_size // 2` tokens are kept and re-prefilled in one forward, so each new token costs O(1)
forward passes amortised and memory stays bounded. Up to the first full window the tokens equal
the uncached path's, which crops the context to its last `block_size` tokens at every step
(nanoGPT's rule); past it the two see different contexts and may differ.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from charlm.config import SampleConfig
from charlm.device import require_memory
from charlm.errors import CharlmError, characters, first_line
from charlm.model import GPT
from charlm.vocab import Vocab, list_unknown


class NonFiniteOutput(CharlmError):
    """The model's logits hold NaN or inf, so there is nothing to sample from."""

    def __init__(self) -> None:
        super().__init__(
            "the model's next-character probabilities are not finite (NaN or inf): its weights "
            "have diverged; sample from an earlier checkpoint, or train again with a lower "
            "optim.lr"
        )


class CachedDecoder:
    """Feeds tokens through the model over a preallocated KV cache.

    `window` mirrors the ids whose keys and values sit in the cache, so a full cache can be
    re-prefilled from its most recent half without keeping the whole history.

    With `compile`, each one-token step runs a `torch.compile`d forward with static shapes: it
    reads the same cache through a view whose position is a device tensor (see `KVCache`), so
    one graph serves every position and no step waits for the host. Prefills stay eager (their
    length varies). Where the graph cannot be built, decoding goes on eagerly after one warning.
    """

    def __init__(self, model: GPT, batch_size: int, compile: bool = False):
        self.model = model
        self.block = model.cfg.block_size
        self.keep = max(self.block // 2, 1)
        self.cache = model.new_cache(batch_size)
        self.window = torch.empty(batch_size, self.block, dtype=torch.long,
                                  device=model.wte.weight.device)
        self.compiled = None
        if compile:
            self.static = copy.copy(self.cache)  # the same key and value tensors
            self.static.pos = torch.zeros((), dtype=torch.long, device=self.window.device)
            self.compiled = torch.compile(self._static_step, dynamic=False)

    def _static_step(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx, cache=self.static)[0]

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        """Start over from idx (B, T), T <= block_size, in one forward; logits (B, V)."""
        self.cache.reset()
        self.window[:, : idx.size(1)] = idx
        logits, _ = self.model(idx, cache=self.cache)
        if self.compiled is not None:
            self.static.pos.fill_(self.cache.pos)
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
                logits = self.compiled(ids[:, None])  # advances self.static.pos on the device
                self.cache.pos += 1
                return logits[:, -1, :]
            except Exception as e:  # the first call builds the graph: no compiler, an op, ...
                print(f"warning: torch.compile failed ({first_line(e)}); decoding without compile",
                      file=sys.stderr)
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


# Logits processors: each maps logits (B, V) to logits (B, V). `build_processors` composes them
# in the documented order: repetition penalty, temperature, top-k, top-p, min-p.


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


def build_processors(opts: SampleConfig) -> list[Processor]:
    """The sampling warpers after the repetition penalty, in order; none for greedy."""
    if opts.temperature == 0:
        return []
    procs: list[Processor] = []
    if opts.temperature != 1.0:
        procs.append(lambda x: apply_temperature(x, opts.temperature))
    if opts.top_k is not None:
        procs.append(lambda x: apply_top_k(x, opts.top_k))
    if opts.top_p is not None and opts.top_p < 1.0:
        procs.append(lambda x: apply_top_p(x, opts.top_p))
    if opts.min_p:
        procs.append(lambda x: apply_min_p(x, opts.min_p))
    return procs


def sample_next(logits: torch.Tensor, temperature: float, procs: Sequence[Processor] = (),
                generator: torch.Generator | None = None) -> torch.Tensor:
    """The next id per row of logits (B, V): argmax for temperature 0, else a draw from the
    softmax of the processed logits."""
    logits = logits.float()
    if temperature == 0:
        ids = logits.argmax(dim=-1)  # a row with a NaN gives the NaN's id
        if not bool(torch.isfinite(logits.gather(-1, ids[:, None])).all()):
            raise NonFiniteOutput
        return ids
    for proc in procs:
        logits = proc(logits)
    probs = torch.softmax(logits, dim=-1)
    # CUDA's multinomial draws from NaN rows without a word (the CPU's raises). The check costs
    # one host sync per token, which streaming the token to the host makes anyway.
    if not bool(torch.isfinite(probs).all()):
        raise NonFiniteOutput
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.inference_mode()
def generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int,
             opts: SampleConfig | None = None,
             generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
    """Yield max_new_tokens tensors of ids (B,), one per step, continuing prompt (B, T0).

    A prompt longer than block_size is cropped to its last block_size tokens. One forward per
    step for the whole batch; no forward is spent on a step that is never asked for.
    """
    opts = opts or SampleConfig()
    model.eval()
    B = prompt.size(0)
    decoder = make_decoder(model, B, opts.use_cache, opts.compile)
    procs = build_processors(opts)
    penalty = opts.repetition_penalty != 1.0
    if penalty:  # ring buffer of the last W ids per row (prompt included); -1 = empty
        # no longer than the ids there will ever be: a huge --repetition-window costs nothing
        W = max(min(opts.repetition_window, prompt.size(1) + max_new_tokens), 1)
        recent = torch.full((B, W), -1, dtype=torch.long, device=prompt.device)
        tail = prompt[:, -W:]
        recent[:, : tail.size(1)] = tail
        slot = tail.size(1) % W
    nxt = None
    for i in range(max_new_tokens):
        logits = decoder.prefill(prompt[:, -decoder.block:]) if i == 0 else decoder.step(nxt)
        if penalty:
            logits = apply_repetition_penalty(logits.float(), recent, opts.repetition_penalty)
        nxt = sample_next(logits, opts.temperature, procs, generator)
        if penalty:
            recent[:, slot] = nxt
            slot = (slot + 1) % W
        yield nxt


def _ends_with_any(ids: list[int], stops: Sequence[list[int]]) -> bool:
    return any(len(ids) >= len(s) and ids[-len(s):] == s for s in stops)


@torch.inference_mode()
def beam_search(model: GPT, prompt: torch.Tensor, max_new_tokens: int, beams: int,
                stops: Sequence[list[int]] = (), use_cache: bool = True,
                length_penalty: float = 1.0, compile: bool = False) -> list[int]:
    """The best continuation of prompt (1, T0) under beam search.

    Hypotheses are ranked by sum of log-probabilities / length**length_penalty, so beams that
    end early at a stop sequence (`stops`, as id lists) compete fairly with longer ones.
    beams=1 is greedy decoding.
    """
    model.eval()
    decoder = make_decoder(model, beams, use_cache, compile)
    device = prompt.device
    scores = torch.full((beams,), float("-inf"), device=device)
    scores[0] = 0.0  # all beams start identical: expand only the first
    seqs: list[list[int]] = [[] for _ in range(beams)]
    finished: list[tuple[float, list[int]]] = []
    last = None
    for t in range(max_new_tokens):
        if t == 0:
            logits = decoder.prefill(prompt[:, -decoder.block:].expand(beams, -1))
        else:
            logits = decoder.step(last)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (N, V)
        V = logp.size(-1)
        cand_scores, cand = (scores[:, None] + logp).view(-1).topk(min(2 * beams, beams * V))
        keep_rows, keep_ids, keep_scores = [], [], []
        for score, flat in zip(cand_scores.tolist(), cand.tolist(), strict=True):
            if math.isnan(score):  # NaN or inf logits (topk ranks NaN first)
                raise NonFiniteOutput
            if score == float("-inf"):
                break
            row, token = divmod(flat, V)
            seq = seqs[row] + [token]
            if stops and _ends_with_any(seq, stops):
                finished.append((score / len(seq) ** length_penalty, seq))
            elif len(keep_rows) < beams:
                keep_rows.append(row)
                keep_ids.append(token)
                keep_scores.append(score)
            if len(keep_rows) == beams:
                break
        if len(finished) >= beams or not keep_rows:
            # the live beams are cut short here: they count only if nothing finished
            break
        while len(keep_rows) < beams:  # pad with a dead beam
            keep_rows.append(keep_rows[0])
            keep_ids.append(keep_ids[0])
            keep_scores.append(float("-inf"))
        index = torch.tensor(keep_rows, device=device)
        decoder.reorder(index)
        seqs = [seqs[r] + [i] for r, i in zip(keep_rows, keep_ids, strict=True)]
        scores = torch.tensor(keep_scores, device=device)
        last = torch.tensor(keep_ids, device=device)
    else:  # every step ran: the live beams end at max_new_tokens, complete hypotheses too
        finished += _ranked(scores, seqs, length_penalty)
    hyps = finished or _ranked(scores, seqs, length_penalty)
    return max(hyps, key=lambda h: h[0])[1] if hyps else []


def _ranked(scores: torch.Tensor, seqs: list[list[int]],
            length_penalty: float) -> list[tuple[float, list[int]]]:
    """(length-normalised score, sequence) of each live beam."""
    return [(s / max(len(q), 1) ** length_penalty, q)
            for s, q in zip(scores.tolist(), seqs, strict=True) if s != float("-inf")]


class StopMatcher:
    """Streams one sample's text while holding back what could be the start of a stop string.

    `feed` returns the text that is safe to show; `done` turns true once the generated text ends
    with a stop string, which is cut off unless `include_stop`.
    """

    def __init__(self, stops: Sequence[str], include_stop: bool):
        # longest first: of stop strings that end together ("ab" and "b"), the longest is cut,
        # whatever the order they were given in
        self.stops = sorted(stops, key=len, reverse=True)
        self.include_stop = include_stop
        self.pending = ""
        self.done = False

    def feed(self, piece: str) -> str:
        self.pending += piece
        for s in self.stops:
            if self.pending.endswith(s):
                self.done = True
                out = self.pending if self.include_stop else self.pending[: -len(s)]
                self.pending = ""
                return out
        hold = max((n for s in self.stops for n in range(1, len(s))
                    if self.pending.endswith(s[:n])), default=0)
        out, self.pending = self.pending[: len(self.pending) - hold], self.pending[
            len(self.pending) - hold:]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


@dataclass
class Sample:
    prompt: str  # the prompt as the model saw it (after --unknown skip and cropping)
    text: str  # the generated text, without the prompt
    tokens: int  # characters generated (stop string included)
    seconds: float  # from the start of the call until this sample finished
    stopped: bool  # ended by a stop string, not by max_new_tokens


def default_prompt(vocab: Vocab) -> str:
    """The prompt when none is given: a newline, or the vocabulary's first character when the
    model never saw a newline."""
    return "\n" if not vocab.unknown("\n") else vocab.chars[0]


def encode_prompt(vocab: Vocab, prompt: str, unknown: str,
                  block_size: int) -> tuple[str, list[int], list[str]]:
    """(prompt as used, its ids, warnings). Unknown characters are an error listing each one
    and its position, or dropped with `unknown='skip'`; a prompt longer than the context keeps
    its last block_size characters."""
    warnings = []
    bad = vocab.unknown(prompt)
    if bad:
        listed = list_unknown(bad, "at position")
        if unknown == "error":
            raise CharlmError(
                f"prompt has characters outside the model's vocabulary: {listed}; "
                "remove them or pass --unknown skip"
            )
        drop = {i for i, _ in bad}
        prompt = "".join(c for i, c in enumerate(prompt) if i not in drop)
        warnings.append(f"skipped {characters(len(bad))} of the prompt outside the vocabulary: "
                        f"{listed}")
    if not prompt:
        raise CharlmError("the prompt is empty; give at least one character the model knows")
    if len(prompt) > block_size:
        warnings.append(f"the prompt has {len(prompt)} characters, more than the context of "
                        f"{block_size}; using its last {block_size}")
        prompt = prompt[-block_size:]
    return prompt, vocab.encode(prompt), warnings


def require_cache_memory(model: GPT, rows: int, option: str) -> None:
    """Refuse `rows` samples or beams whose keys and values over a full context (what the KV
    cache holds; the uncached forward computes as much) alone exceed the device's memory."""
    cfg, weight = model.cfg, model.wte.weight
    need = 2 * cfg.n_layer * rows * cfg.block_size * cfg.n_embd * weight.element_size()
    require_memory(need, weight.device,
                   f"{option} {rows:,} needs {{gib}} for the keys and values of the context",
                   f"use a smaller {option}")


def sample_text(model: GPT, vocab: Vocab, prompt: str, opts: SampleConfig,
                on_text: Callable[[int, str], None] | None = None) -> list[Sample]:
    """Generate opts.num_samples continuations of `prompt` (checked by `encode_prompt`), as
    one batch, or the best beam when opts.beams is set. on_text(sample index, text) is called as
    each piece of text becomes final (stop strings are held back until they cannot match)."""
    if opts.beams is not None:
        require_cache_memory(model, opts.beams, "--beams")
    else:
        require_cache_memory(model, opts.num_samples, "--num-samples")
    device = model.wte.weight.device
    ids = torch.tensor([vocab.encode(prompt)], device=device)
    t0 = time.perf_counter()
    emit = on_text or (lambda i, s: None)
    if opts.beams is not None:
        stops = [vocab.encode(s) for s in opts.stop if not vocab.unknown(s)]
        best = beam_search(model, ids, opts.max_new_tokens, opts.beams, stops, opts.use_cache,
                           compile=opts.compile)
        matcher = StopMatcher(opts.stop, opts.include_stop)
        text = matcher.feed(vocab.decode(best)) + matcher.flush()
        emit(0, text)
        return [Sample(prompt, text, len(best), time.perf_counter() - t0, matcher.done)]

    K = opts.num_samples
    generator = torch.Generator(device=device).manual_seed(opts.seed)
    matchers = [StopMatcher(opts.stop, opts.include_stop) for _ in range(K)]
    texts = [""] * K
    counts = [0] * K
    seconds = [0.0] * K
    steps = generate(model, ids.expand(K, -1), opts.max_new_tokens, opts, generator)
    for step_ids in steps:
        for i, token in enumerate(step_ids.tolist()):
            m = matchers[i]
            if m.done:
                continue
            counts[i] += 1
            piece = m.feed(vocab.chars[token])
            if m.done:
                seconds[i] = time.perf_counter() - t0
            if piece:
                texts[i] += piece
                emit(i, piece)
        if all(m.done for m in matchers):
            steps.close()
            break
    for i, m in enumerate(matchers):
        rest = m.flush()
        if rest:
            texts[i] += rest
            emit(i, rest)
        if not m.done:
            seconds[i] = time.perf_counter() - t0
    return [Sample(prompt, texts[i], counts[i], seconds[i], matchers[i].done) for i in range(K)]


def preview(model: GPT, vocab: Vocab, chars: int, seed: int) -> str:
    """A short sample for a training run's log: `chars` characters continuing a newline (or the
    vocabulary's first character when it has none), prompt included. It draws from its own
    seeded generator, so the training RNG is untouched, and it restores the model's mode."""
    was_training = model.training
    prompt = default_prompt(vocab)
    try:
        [sample] = sample_text(model, vocab, prompt, SampleConfig(max_new_tokens=chars, seed=seed))
    finally:
        model.train(was_training)
    return prompt + sample.text
