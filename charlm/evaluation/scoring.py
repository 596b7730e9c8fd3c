"""Scoring a text file with a trained model: a full deterministic pass in overlapping windows,
giving the loss in nats per character, bits per character and perplexity.

Windows of `block_size` characters advance by `block_size - min_context`, and each window scores
only the characters not scored before, so every character after the first is scored exactly
once, and every one past the first window sees at least `min_context` characters of context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from charlm.core.errors import CharlmError, characters
from charlm.data.vocab import Vocab, list_unknown
from charlm.generation.decoding import NonFiniteOutput
from charlm.model.footprint import scoring_bytes
from charlm.model.gpt import GPT
from charlm.runtime.device import require_memory

PROGRESS_MIN_WINDOWS = 200


WINDOWS_PER_FORWARD = 32


@dataclass
class Score:
    loss: float  # mean negative log-likelihood, nats per character
    bpc: float  # bits per character
    perplexity: float
    chars_scored: int
    skipped_unknown: int

    def as_dict(self) -> dict[str, float | int | None]:
        """The fields as strict-JSON data: a non-finite number (a diverged model's NaN loss, an
        infinite perplexity) is None."""
        return {k: finite_or_none(v) for k, v in self.__dict__.items()}

    def notes(self) -> list[str]:
        """What `charlm eval` prints as `warning:` lines (`charlm.score` warns with them)."""
        if not self.skipped_unknown:
            return []
        return [f"skipped {characters(self.skipped_unknown)} outside the vocabulary"]


def windows(n_ids: int, block: int, min_context: int) -> list[tuple[int, int]]:
    """(start, first new target offset) per window over n_ids ids.

    Window k feeds ids[start : start + block] and predicts targets ids[start + 1 : ...]; of those
    it scores the ones from `offset` on (earlier ones were scored by the previous window).
    """
    step = block - min_context
    out, scored_to, start = [], 0, 0  # scored_to: targets 1..scored_to are done
    while scored_to < n_ids - 1:
        end = min(start + block, n_ids - 1)  # last target index of this window
        out.append((start, scored_to - start))
        scored_to = end
        start += step
    return out


def check_stride(block: int, min_context: int) -> None:
    """Each window must score at least one new character: min_context below block_size."""
    if not 0 <= min_context < block:
        raise CharlmError(f"--stride must be in [0, {block - 1}] for block_size {block}, "
                          f"got {min_context}")


def require_score_memory(model: GPT, n_ids: int, min_context: int) -> None:
    """Refuse to score n_ids ids whose ids, plan of windows and one forward of
    `WINDOWS_PER_FORWARD` windows (`memory.scoring_bytes`) exceed the device's memory, before
    the text is encoded: a long text with a high --stride is millions of windows."""
    block = model.cfg.block_size
    beyond = n_ids - 1 - block  # targets past the first window
    count = 1 + max(0, -(-beyond // (block - min_context)))  # len(windows(...)), unbuilt
    full = beyond // (block - min_context) + 1 if beyond >= 0 else 0  # windows of `block`
    rows = min(WINDOWS_PER_FORWARD, full) or 1
    weight = model.wte.weight
    need = scoring_bytes(model.cfg, model.vocab_size, n_ids, count, rows)
    require_memory(need, weight.device,
                   f"scoring {characters(n_ids)} in {count:,} windows of {block} needs about "
                   f"{{gib}} for their ids, the windows and a forward of {rows} windows",
                   "score a shorter text (split the file into parts), or lower --stride for "
                   "fewer windows")


@torch.inference_mode()
def score_ids(model: GPT, ids: torch.Tensor, min_context: int,
              batch_size: int = WINDOWS_PER_FORWARD, progress: bool = True) -> tuple[float, int]:
    """(total negative log-likelihood in nats, characters scored) of ids (N,)."""
    model.eval()
    block = model.cfg.block_size
    check_stride(block, min_context)
    plan = windows(len(ids), block, min_context)
    # Windows of exactly `block` inputs come first; at most one shorter window ends the plan.
    n_full = sum(1 for start, _ in plan if start + block <= len(ids) - 1)
    full, tail = plan[:n_full], plan[n_full:]
    total, count = 0.0, 0
    arange = torch.arange(block + 1, device=ids.device)
    # disable=None: tqdm shows the bar only on a terminal.
    bar = tqdm(total=len(plan), desc="eval", unit="window",
               disable=True if not progress or len(plan) < PROGRESS_MIN_WINDOWS else None)
    for i in range(0, len(full), batch_size):
        chunk = full[i:i + batch_size]
        starts = torch.tensor([s for s, _ in chunk], device=ids.device)
        rows = ids[starts[:, None] + arange]  # (B, block + 1)
        # summed on the CPU in float64 (MPS has no float64), one copy a batch rather than a
        # wait for the device per row
        nll = _nll(model, rows[:, :-1], rows[:, 1:]).cpu()  # (B, block)
        for row, (_, offset) in enumerate(chunk):
            total += nll[row, offset:].sum(dtype=torch.float64).item()
            count += block - offset
        bar.update(len(chunk))
    for start, offset in tail:
        row = ids[start:][None, :]  # (1, n) with n - 1 < block + 1
        nll = _nll(model, row[:, :-1], row[:, 1:]).cpu()
        total += nll[0, offset:].sum(dtype=torch.float64).item()
        count += nll.size(1) - offset
        bar.update(1)
    bar.close()
    return total, count


def _nll(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-position negative log-likelihood (B, T) in float32."""
    logits, _ = model(x)
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, y[..., None])[..., 0]


def score_text(model: GPT, vocab: Vocab, text: str, min_context: int | None = None,
               unknown: str = "error", progress: bool = True) -> Score:
    """Score `text`; characters outside the vocabulary are an error, or dropped with
    unknown='skip' (and counted)."""
    if unknown not in ("error", "skip"):  # `charlm eval --unknown` and charlm.score
        raise CharlmError(f"--unknown must be 'error' or 'skip', got {unknown!r}")
    text = vocab.normalized(text)  # as the model's data was
    bad = vocab.unknown(text)
    if bad and unknown == "error":
        raise CharlmError(
            f"the text has {characters(len(bad))} outside the model's vocabulary "
            f"({list_unknown(bad)}); "
            "pass --unknown skip to drop them"
        )
    if bad:
        drop = {i for i, _ in bad}
        text = "".join(c for i, c in enumerate(text) if i not in drop)
    if len(text) < 2:
        raise CharlmError("the text needs at least two characters the model knows to be scored")
    block = model.cfg.block_size
    min_context = block // 2 if min_context is None else min_context
    check_stride(block, min_context)
    require_score_memory(model, len(text), min_context)
    ids = torch.from_numpy(vocab.encode_array(text).astype("int64")).to(model.wte.weight.device)
    total, count = score_ids(model, ids, min_context, progress=progress)
    loss = total / count
    if math.isnan(loss):  # finite weights whose logits overflow: no score to give
        raise NonFiniteOutput("score")
    try:
        perplexity = math.exp(loss)
    except OverflowError:  # a loss past about 709 nats (a diverged model)
        perplexity = math.inf
    return Score(loss, loss / math.log(2), perplexity, count, len(bad))


def finite_or_none(value: Any) -> Any:
    """A float that JSON cannot hold (a skipped step's NaN loss, the best val loss before any
    finite eval) becomes null, so metrics.jsonl stays strict JSON."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
