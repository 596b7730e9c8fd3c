"""Beam search over a `Decoder` (`search_beams`, which seq2seq shares), and for a GPT's prompt."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from charlm.generation.decoding import Decoder, NonFiniteOutput, make_decoder
from charlm.generation.utf8 import Utf8Mask
from charlm.model.gpt import GPT


@torch.inference_mode()
def beam_search(model: GPT, prompt: torch.Tensor, max_new_tokens: int, beams: int,
                stops: Sequence[list[int]] = (), use_cache: bool = True, compile: bool = False,
                mask: Utf8Mask | None = None) -> list[int]:
    """The best continuation of prompt (1, T0); a beam ends at any of `stops` (id lists). A
    byte model's `mask` (a row a beam) keeps every beam valid UTF-8."""
    model.eval()
    decoder = make_decoder(model, beams, use_cache, compile)
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
