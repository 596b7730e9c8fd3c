"""An encoder-decoder's decoding over an encoded source: greedy or sampled (`translate_ids`),
or the n best of a beam search (`beam_search_ids`); and its text layer, sources in, target text
out (`translate`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError, Setting, SettingError
from charlm.data.batches import collate
from charlm.data.pairs import PairVocab
from charlm.generation.decoding import NonFiniteOutput, search_beams
from charlm.generation.sampler import Sampler
from charlm.generation.text import require_cache_memory
from charlm.model.encoder_decoder import EncoderDecoder, EncoderOutput, output_limit

BATCH = 64  # sources `translate` decodes together

class Seq2SeqDecoder:
    """A `Decoder` of target ids over a fixed `EncoderOutput` (B rows); use_cache=False
    recomputes the whole target prefix each step. pad and bos are never an output: -inf."""

    def __init__(self, model: EncoderDecoder, memory: EncoderOutput, use_cache: bool = True,
                 max_len: int | None = None):
        self.model = model
        self.memory = memory
        self.block = model.cfg.block_size
        B = memory.out.size(0)
        self.cache = model.new_cache(B, max_len) if use_cache else None
        self.context = torch.empty(B, 0, dtype=torch.long, device=memory.out.device)
        self.never = torch.tensor([model.pad, model.bos], device=memory.out.device)

    def _next(self, idx: torch.Tensor) -> torch.Tensor:
        logits, _ = self.model(None, idx, cache=self.cache, memory=self.memory)
        return logits[:, -1, :].index_fill(-1, self.never, float("-inf"))  # (B, V)

    def prefill(self, idx: torch.Tensor) -> torch.Tensor:
        self.context = idx
        if self.cache is not None:
            self.cache.reset()
        return self._next(idx)

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            return self.prefill(torch.cat([self.context, ids[:, None]], dim=1))
        return self._next(ids[:, None])

    def reorder(self, index: torch.Tensor) -> None:
        """Make row i continue from row index[i]; a shorter index drops the other rows."""
        if self.cache is not None:
            self.cache.k = [k[index] for k in self.cache.k]
            self.cache.v = [v[index] for v in self.cache.v]
        self.context = self.context[index]
        self.memory = self.memory.select(index)


def _limits(model: EncoderDecoder, memory: EncoderOutput, cap: int,
            max_len: int | Sequence[int] | None) -> list[int]:
    """Each row's longest output: given, or `output_limit` of its source; within the window."""
    block = model.cfg.block_size
    if max_len is None:
        return [output_limit(n, block, cap) for n in memory.mask.sum(dim=1).tolist()]
    B = memory.out.size(0)
    limits = [max_len] * B if isinstance(max_len, int) else list(max_len)
    if len(limits) != B:
        raise ValueError(f"max_len has {len(limits)} entries for {B} sources")
    return [max(min(m, block - 1), 0) for m in limits]


@torch.inference_mode()
def translate_ids(model: EncoderDecoder, src: torch.Tensor, opts: SampleConfig,
                  max_len: int | Sequence[int] | None = None,
                  generator: torch.Generator | None = None) -> list[list[int]]:
    """Each source row of src (B, S)'s target ids (without bos, eos or pad), greedy or sampled
    as `opts` says (not its beam, stop, prompt or compile options). A row that reaches eos or
    its limit (`max_len`, default `output_limit`) leaves the batch, costing nothing more."""
    model.eval()
    memory = model.encode(src)
    limits = _limits(model, memory, opts.max_new_tokens, max_len)
    out: list[list[int]] = [[] for _ in limits]
    rows = [r for r, n in enumerate(limits) if n > 0]  # the source row of each decoder row
    if not rows:
        return out
    if len(rows) < len(limits):
        memory = memory.select(torch.tensor(rows, device=src.device))
    steps = max(limits)
    decoder = Seq2SeqDecoder(model, memory, opts.use_cache, steps)
    sampler = Sampler(min(opts.repetition_window, steps), src.device, generator=generator)
    # the repetition penalty looks at the output only: the source is another vocabulary
    sampler.add(opts, src.new_empty(len(rows), 0))
    nxt = torch.full((len(rows),), model.bos, dtype=torch.long, device=src.device)
    for t in range(steps):
        logits = decoder.prefill(nxt[:, None]) if t == 0 else decoder.step(nxt)
        nxt, tokens, ok, _ = sampler.step(logits)
        if not all(ok):
            raise NonFiniteOutput
        live = []
        for j, token in enumerate(tokens):
            r = rows[j]
            if token != model.eos:
                out[r].append(token)
                if len(out[r]) < limits[r]:
                    live.append(j)
        if not live:
            break
        if len(live) < len(rows):
            decoder.reorder(torch.tensor(live, device=src.device))
            sampler.keep(live)
            nxt = nxt[live]
            rows = [rows[j] for j in live]
    return out


@torch.inference_mode()
def beam_search_ids(model: EncoderDecoder, src: torch.Tensor, beams: int,
                    max_len: int | None = None, n_best: int = 1,
                    use_cache: bool = True) -> list[tuple[float, list[int]]]:
    """The n_best hypotheses of `search_beams` for one source src (1, S), without eos (their
    length counts it), ending at eos or max_len ids (default: `output_limit`)."""
    if src.size(0) != 1:
        raise ValueError(f"beam search decodes one source at a time, got {src.size(0)}")
    if not 1 <= n_best <= beams:
        raise ValueError(f"n_best must be in 1..beams={beams}, got {n_best}")
    model.eval()
    memory = model.encode(src)
    limit = _limits(model, memory, model.cfg.block_size, max_len)[0]
    first = torch.zeros(beams, dtype=torch.long, device=src.device)
    decoder = Seq2SeqDecoder(model, memory.select(first), use_cache, max(limit, 1))
    start = torch.full((beams, 1), model.bos, dtype=torch.long, device=src.device)
    eos = model.eos
    hyps = search_beams(decoder, start, limit, beams, lambda seq: seq[-1] == eos)
    return [(score, seq[:-1] if seq and seq[-1] == eos else seq)
            for score, seq in hyps[:n_best]]


@dataclass
class Translation:
    source: str
    outputs: list[tuple[str, float | None]]  # (text, score): n-best (beams) or samples, best first

    @property
    def text(self) -> str:
        return self.outputs[0][0]

    def as_dict(self) -> dict:
        return {"source": self.source,
                "outputs": [{"text": t, "score": None if s is None else round(s, 6)}
                            for t, s in self.outputs]}


def encode_sources(model: EncoderDecoder, vocab: PairVocab, sources: Sequence[str],
                   unknown: str = "error") -> list[list[int]]:
    block = model.cfg.block_size
    encoded = []
    for i, text in enumerate(sources, 1):
        where = f"source {i}" if len(sources) > 1 else "the source"
        ids = vocab.encode_source(text, unknown, where)
        if not ids:
            raise CharlmError(f"{where} is empty; give at least one character to transduce")
        if len(ids) > block:
            raise CharlmError(f"{where} is {len(ids)} characters, over the model's block_size "
                              f"{block}; shorten it")
        encoded.append(ids)
    return encoded


def translate(model: EncoderDecoder, vocab: PairVocab, sources: Sequence[str],
              opts: SampleConfig) -> Iterator[Translation]:
    """One `Translation` per source, in order: opts.num_samples outputs each, decoded `BATCH`
    sources at a time, or with beams one source at a time, the n best with their scores."""
    model.eval()
    encoded = encode_sources(model, vocab, sources, opts.unknown)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(opts.seed)
    K = opts.num_samples
    if opts.beams is not None and opts.beams < K:
        raise SettingError(Setting("num_samples"), f" {K} asks for the {K} best of ",
                           Setting("beams"), f" {opts.beams}; give at most {opts.beams}, "
                           "or more beams")
    require_cache_memory(model, opts, 1 if opts.beams is not None else min(BATCH, len(encoded)))
    for first in range(0, len(sources), BATCH):
        chunk = encoded[first:first + BATCH]
        if opts.beams is not None:
            for i, ids in enumerate(chunk):
                src = torch.tensor([ids], device=device)
                hyps = beam_search_ids(model, src, opts.beams, n_best=K,
                                       use_cache=opts.use_cache,
                                       max_len=output_limit(len(ids), model.cfg.block_size,
                                                            opts.max_new_tokens))
                yield Translation(sources[first + i],
                                  [(vocab.decode_target(h), s) for s, h in hyps])
            continue
        src, _, _ = collate([(ids, [0]) for ids in chunk], vocab)
        outs = translate_ids(model, src.to(device).repeat_interleave(K, 0), opts,
                             generator=generator)
        for i in range(len(chunk)):
            yield Translation(sources[first + i],
                              [(vocab.decode_target(o), None) for o in outs[i * K:(i + 1) * K]])
