"""An encoder-decoder scored against multi-reference pairs (G2P, say): exact match, word error
rate and unit error rate of its outputs, and its loss: what `charlm eval` reports on pairs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError
from charlm.data.batches import IGNORE_INDEX, collate
from charlm.data.pairs import PairVocab
from charlm.generation.seq2seq import BATCH, translate
from charlm.model.encoder_decoder import EncoderDecoder


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance, keeping one row of the table."""
    if len(a) < len(b):
        a, b = b, a
    row = list(range(len(b) + 1))  # distances from a[:0] to each prefix of b
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


@dataclasses.dataclass
class Accuracy:
    """How a model's outputs compare with the references of `sources` distinct sources."""

    sources: int
    exact_match: float  # share of sources whose output equals one of its references
    wer: float  # 1 - exact_match: the G2P literature's word error rate
    cer: float  # edit distance / reference units: the phoneme error rate with space units
    ref_units: int  # units of the closest reference of each source, summed
    errors: int  # edit distance to the closest reference of each source, summed


def accuracy(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
             units: Callable[[str], list[str]]) -> Accuracy:
    """Each hypothesis against its source's references, as lists of `units`; wer is the G2P
    literature's, not fairseq's edit rate; cer's closest reference on a tie is the shorter."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} sources")
    if not hypotheses:
        raise CharlmError("no sources to measure accuracy on: the split is empty; give more "
                          "pairs or a larger data.test_fraction")
    matches = errors = ref_units = 0
    for hypothesis, refs in zip(hypotheses, references, strict=True):
        if not refs:
            raise ValueError(f"no reference for the hypothesis {hypothesis!r}")
        hyp = units(hypothesis)
        candidates = [units(r) for r in refs]
        matches += any(hyp == ref for ref in candidates)
        distance, length = min((edit_distance(hyp, ref), len(ref)) for ref in candidates)
        errors += distance
        ref_units += length
    exact = matches / len(hypotheses)
    # only empty references (no units to get wrong): any output unit is infinitely many errors
    cer = errors / ref_units if ref_units else (math.inf if errors else 0.0)
    return Accuracy(len(hypotheses), exact, 1 - exact, cer, ref_units, errors)


def output_accuracy(model: EncoderDecoder, vocab: PairVocab,
                    references: Sequence[tuple[str, list[str]]],
                    opts: SampleConfig | None = None) -> tuple[Accuracy, list[str]]:
    """The accuracy of the greedy (or opts.beams) outputs, and the outputs."""
    if not references:
        raise CharlmError("there are no pairs to score")
    opts = opts or SampleConfig(temperature=0, num_samples=1)
    hyps = [t.text for t in translate(model, vocab, [s for s, _ in references], opts)]
    return accuracy(hyps, [refs for _, refs in references], vocab.units), hyps


def rate_name(vocab: PairVocab) -> str:
    """PER (phoneme error rate) for space-separated units, else CER."""
    return "PER" if vocab.target_units == "space" else "CER"


@torch.no_grad()
def pair_loss(model: EncoderDecoder, vocab: PairVocab, pairs: Sequence[tuple[str, str]],
              unknown: str = "error") -> tuple[float, int, int]:
    """Teacher-forced mean loss (nats per target unit, eos included) over the pairs whose units
    the vocabulary holds, the units scored, and the pairs left out."""
    model.eval()
    device = next(model.parameters()).device
    known = [(s, t) for s, t in pairs if all(u in vocab.target_index for u in vocab.units(t))]
    total, units = 0.0, 0
    for first in range(0, len(known), BATCH):
        chunk = [(vocab.encode_source(s, unknown), vocab.encode_target(t))
                 for s, t in known[first:first + BATCH]]
        src, tgt_in, tgt_out = (x.to(device) for x in collate(chunk, vocab))
        _, loss = model(src, tgt_in, tgt_out)
        n = int((tgt_out != IGNORE_INDEX).sum())
        total += float(loss) * n
        units += n
    return (total / units if units else math.nan), units, len(pairs) - len(known)


def score_pairs(model: EncoderDecoder, vocab: PairVocab,
                references: Sequence[tuple[str, list[str]]],
                opts: SampleConfig | None = None) -> dict[str, float | int | str]:
    """`output_accuracy`, and `pair_loss` over every reference pair."""
    acc, _ = output_accuracy(model, vocab, references, opts)
    loss, units, left_out = pair_loss(model, vocab,
                                      [(s, t) for s, refs in references for t in refs],
                                      opts.unknown if opts else "error")
    return {**dataclasses.asdict(acc), "units": vocab.target_units,
            "loss": loss if units else None,
            "bits_per_unit": loss / math.log(2) if units else None, "units_scored": units,
            "references_not_scored": left_out}
