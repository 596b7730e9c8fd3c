"""Accuracy of an encoder-decoder's outputs against multi-reference pairs (G2P, say): exact
match, word error rate and unit error rate."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from charlm.core.errors import CharlmError


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


@dataclass
class Accuracy:
    """How a model's outputs compare with the references of `sources` distinct sources."""

    sources: int
    exact_match: float  # share of sources whose output equals one of its references
    wer: float  # 1 - exact_match: the G2P literature's word error rate
    cer: float  # edit distance / reference units: the phoneme error rate with space units
    ref_units: int  # units of the closest reference of each source, summed
    errors: int  # edit distance to the closest reference of each source, summed

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
