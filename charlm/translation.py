"""The text layer of the encoder-decoder: sources in, target text out (`translate`), and the
scores of a model on reference pairs (`score_pairs`: exact match, WER, CER / PER, loss). The
decoding itself is `charlm.seq2seq`'s; the data conventions are `charlm.pairs`'.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from charlm.accuracy import Accuracy, accuracy
from charlm.errors import CharlmError
from charlm.pair_batches import collate
from charlm.sample_config import SampleConfig
from charlm.sampling import require_cache_memory
from charlm.seq2seq import EncoderDecoder, beam_search_ids, output_limit, translate_ids
from charlm.vocab import PairVocab

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
    """Each source's ids; an empty source (also after --unknown skip) or one longer than the
    model's block_size is an error naming its line."""
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
    """Yield one `Translation` per source, in order. Greedy or sampled outputs are decoded
    `BATCH` sources at a time (opts.num_samples each); beam search decodes one source at a time
    with its beams as a batch and returns opts.num_samples best hypotheses with their scores."""
    model.eval()
    encoded = encode_sources(model, vocab, sources, opts.unknown)
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(opts.seed)
    K = opts.num_samples
    if opts.beams is not None:
        if opts.beams < K:
            raise CharlmError(f"--num-samples {K} asks for the {K} best of --beams "
                              f"{opts.beams}; give at most {opts.beams}, or more beams")
        require_cache_memory(model, "--beams", opts.beams)
    else:
        require_cache_memory(model, "--num-samples", K, min(BATCH, len(encoded)))
    for first in range(0, len(sources), BATCH):
        chunk = encoded[first:first + BATCH]
        if opts.beams is not None:
            for i, ids in enumerate(chunk):
                src = torch.tensor([ids], device=device)
                hyps = beam_search_ids(model, src, opts.beams, n_best=K,
                                       use_cache=opts.use_cache,
                                       max_len=_cap(opts, len(ids), model))
                yield Translation(sources[first + i],
                                  [(vocab.decode_target(h), s) for s, h in hyps])
            continue
        src, _, _ = collate([(ids, [0]) for ids in chunk], vocab)
        outs = translate_ids(model, src.to(device).repeat_interleave(K, 0), opts,
                             generator=generator)
        for i in range(len(chunk)):
            yield Translation(sources[first + i],
                              [(vocab.decode_target(o), None) for o in outs[i * K:(i + 1) * K]])


def _cap(opts: SampleConfig, source_len: int, model: EncoderDecoder) -> int:
    return output_limit(source_len, model.cfg.block_size, opts.max_new_tokens)


def output_accuracy(model: EncoderDecoder, vocab: PairVocab,
                    references: Sequence[tuple[str, list[str]]],
                    opts: SampleConfig | None = None) -> tuple[Accuracy, list[str]]:
    """The accuracy of the model's outputs (greedy, or opts.beams) against the references, and
    the outputs."""
    if not references:
        raise CharlmError("there are no pairs to score")
    opts = opts or SampleConfig(temperature=0, num_samples=1)
    hyps = [t.text for t in translate(model, vocab, [s for s, _ in references], opts)]
    return accuracy(hyps, [refs for _, refs in references], vocab.units), hyps


def rate_name(vocab: PairVocab) -> str:
    """What CER is called for these units: the phoneme error rate for space-separated ones."""
    return "PER" if vocab.target_units == "space" else "CER"


@torch.no_grad()
def pair_loss(model: EncoderDecoder, vocab: PairVocab, pairs: Sequence[tuple[str, str]],
              unknown: str = "error") -> tuple[float, int, int]:
    """Teacher-forced mean loss (nats per target unit, the end id included) over the pairs
    whose target units are all in the vocabulary, the number of units scored, and the number
    of pairs left out (a reference with a unit the model cannot output)."""
    model.eval()
    device = next(model.parameters()).device
    known = [(s, t) for s, t in pairs if all(u in vocab.target_index for u in vocab.units(t))]
    total, units = 0.0, 0
    for first in range(0, len(known), BATCH):
        chunk = [(vocab.encode_source(s, unknown), vocab.encode_target(t))
                 for s, t in known[first:first + BATCH]]
        src, tgt_in, tgt_out = (x.to(device) for x in collate(chunk, vocab))
        _, loss = model(src, tgt_in, tgt_out)
        n = int((tgt_out != -1).sum())
        total += float(loss) * n
        units += n
    return (total / units if units else math.nan), units, len(pairs) - len(known)


def score_pairs(model: EncoderDecoder, vocab: PairVocab,
                references: Sequence[tuple[str, list[str]]],
                opts: SampleConfig | None = None) -> dict[str, float | int | str]:
    """Exact match, WER (1 - exact match: the share of sources whose output equals none of
    their references), CER (edit distance / reference length in target units; with space
    units the phoneme error rate) of the greedy (or opts.beams) outputs, and the teacher-forced
    loss over every reference pair."""
    acc, _ = output_accuracy(model, vocab, references, opts)
    loss, units, left_out = pair_loss(model, vocab,
                                      [(s, t) for s, refs in references for t in refs],
                                      opts.unknown if opts else "error")
    return {**acc.as_dict(), "units": vocab.target_units,
            "loss": loss if units else None,
            "bits_per_unit": loss / math.log(2) if units else None, "units_scored": units,
            "references_not_scored": left_out}


def read_sources(source: str | None, source_file: Path | None, arch: str) -> list[str]:
    """The sources of `charlm sample`: --source TEXT, --source - (stdin) or --source-file, one
    source per line (a final newline ends the last line; CRLF is taken as a line end)."""
    if arch != "encoder_decoder":
        raise CharlmError("--source and --source-file are for an encoder-decoder; this model is "
                          "a GPT: give --prompt or --prompt-file")
    if source is not None and source_file is not None:
        raise CharlmError("give the sources either with --source or with --source-file, not both")
    if source is None and source_file is None:
        raise CharlmError("an encoder-decoder transduces sources: give --source TEXT, --source - "
                          "(one per line on stdin) or --source-file FILE")
    if source is not None and source != "-":
        return [source]
    from charlm.data import decode_chunks, read_text

    if source_file is not None:
        if not source_file.is_file():
            raise CharlmError(f"source file not found (or not a file): {source_file}")
        text = read_text(source_file)
    else:
        if sys.stdin is None:
            raise CharlmError("--source - reads the sources from stdin, which is closed")
        text = "".join(t for _, t in decode_chunks(sys.stdin.buffer, "the sources on stdin"))
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise CharlmError("there are no sources: the input is empty")
    return lines


def print_translations(model: EncoderDecoder, vocab: PairVocab, sources: Sequence[str],
                       opts: SampleConfig, json_out: bool) -> None:
    """One output line per source and output (--num-samples or n-best), or with json_out one
    JSON object per source, each printed as soon as it is decoded."""
    out = sys.stdout
    for t in translate(model, vocab, sources, opts):
        if json_out:
            out.write(json.dumps(t.as_dict(), ensure_ascii=False) + "\n")
        else:
            out.write("".join(text + "\n" for text, _ in t.outputs))
        out.flush()


def eval_pairs_file(lm: Any, path: Path, unknown: str, json_out: bool,
                    beams: int | None) -> None:
    """`charlm eval` of an encoder-decoder on a file of pairs (the run's separator and units):
    every reference of a source counts (see `score_pairs`)."""
    from charlm.data import check_input_file
    from charlm.pairs import read_pairs

    check_input_file(path)
    cfg = lm.config
    pairs, _ = read_pairs(path, cfg.data, cfg.model.block_size)
    grouped: dict[str, list[str]] = {}
    for s, t in pairs:
        grouped.setdefault(s, []).append(t)
    opts = SampleConfig(temperature=0, beams=beams, unknown=unknown)
    result = score_pairs(lm.model, lm.vocab, list(grouped.items()), opts)
    if result["references_not_scored"]:
        print(f"warning: {result['references_not_scored']:,} references hold target units "
              "outside the model's vocabulary: they count for exact match and "
              f"{rate_name(lm.vocab)} (never matched), not for the loss", file=sys.stderr)
    if json_out:
        print(json.dumps(result, allow_nan=False))
        return
    rate = rate_name(lm.vocab)
    loss = ("no loss (no reference in the vocabulary)" if result["loss"] is None else
            f"loss {result['loss']:.4f} nats/unit, {result['bits_per_unit']:.4f} bits/unit")
    print(f"exact match {result['exact_match']:.2%}, WER {result['wer']:.2%}, {rate} "
          f"{result['cer']:.2%} ({result['sources']:,} sources, {result['ref_units']:,} "
          f"reference units), {loss}")
