"""The encoder-decoder's text layer: sources in, target text out (`translate`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError, Setting, SettingError
from charlm.data.batches import collate
from charlm.data.pairs import PairVocab
from charlm.generation.seq2seq import beam_search_ids, translate_ids
from charlm.generation.text import require_cache_memory
from charlm.model.encoder_decoder import EncoderDecoder, output_limit

BATCH = 64  # sources decoded together


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
    """Each source's ids; an empty or too long one is an error naming it."""
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
    if opts.beams is not None:
        if opts.beams < K:
            raise SettingError(Setting("num_samples"), f" {K} asks for the {K} best of ",
                               Setting("beams"), f" {opts.beams}; give at most {opts.beams}, "
                               "or more beams")
        require_cache_memory(model, "beams", opts.beams)
    else:
        require_cache_memory(model, "num_samples", K, min(BATCH, len(encoded)))
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
