"""An encoder-decoder scored against references: what `charlm eval` reports on pairs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError
from charlm.data.batches import collate
from charlm.data.pairs import PairVocab
from charlm.evaluation.accuracy import Accuracy, accuracy
from charlm.generation.seq2seq import BATCH, translate
from charlm.model.encoder_decoder import EncoderDecoder


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
        n = int((tgt_out != -1).sum())
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
    return {**acc.as_dict(), "units": vocab.target_units,
            "loss": loss if units else None,
            "bits_per_unit": loss / math.log(2) if units else None, "units_scored": units,
            "references_not_scored": left_out}
