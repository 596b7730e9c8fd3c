"""Scoring a text with a trained model: nats and bits per character and perplexity, in one
deterministic pass of windows of `block_size` characters that advance by `block_size -
min_context` and score only the characters not scored before. The text streams through a chunk
at a time, as `prepare` reads it, so memory stays bounded whatever its size."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from charlm.core.errors import CharlmError, Setting, SettingError, characters
from charlm.core.files import open_regular
from charlm.data.chunks import CHUNK_BYTES, check_input_file, code_point_chunks, narrow_code_points
from charlm.data.sources import CODECS, READ_ERRORS, Source
from charlm.data.vocab import UNKNOWN_LISTED, Vocab, check_unknown_policy, list_unknown
from charlm.generation.decoding import NonFiniteOutput
from charlm.model.footprint import scoring_bytes
from charlm.model.gpt import GPT
from charlm.runtime.device import require_memory

WINDOWS_PER_FORWARD = 32


@dataclass
class Score:
    loss: float  # mean negative log-likelihood, nats per character
    bpc: float  # bits per character
    perplexity: float
    chars_scored: int
    skipped_unknown: int

    def as_dict(self) -> dict[str, float | int | None]:
        """The fields as strict JSON: a non-finite number is None."""
        return {k: finite_or_none(v) for k, v in self.__dict__.items()}

    def notes(self) -> list[str]:
        """What `charlm eval` prints as `warning:` lines."""
        if not self.skipped_unknown:
            return []
        return [f"skipped {characters(self.skipped_unknown)} outside the vocabulary"]


@dataclass
class Unknown:
    """The characters outside the vocabulary met in a stream: a count and the first few."""

    count: int = 0
    first: list[tuple[int, str]] = field(default_factory=list)

    def add(self, at: int, cps: bytes | np.ndarray, positions: np.ndarray) -> None:
        """Count the characters at `positions` of the chunk `cps`, which starts at `at`."""
        self.count += len(positions)
        for i in positions[:UNKNOWN_LISTED - len(self.first)].tolist():
            self.first.append((at + i, chr(int(cps[i]))))

    def error(self) -> CharlmError:
        return CharlmError(
            f"the text has {characters(self.count)} outside the model's vocabulary "
            f"({list_unknown(self.first, total=self.count)}); pass --unknown skip to drop them")


def known_ids(chunks: Iterable[bytes | np.ndarray], vocab: Vocab, unknown: Unknown,
              stop: bool) -> Iterator[np.ndarray]:
    """The ids of `chunks`' code points, less the characters outside the vocabulary, which
    `unknown` counts; with `stop`, none after the first such (the rest only counted)."""
    at = 0
    for cps in chunks:
        ids, bad = vocab.encode_known(cps)
        if len(bad):
            unknown.add(at, cps, bad)
        at += len(cps)
        if not (stop and unknown.count):
            yield ids


def stream_windows(chunks: Iterable[np.ndarray], block: int,
                   min_context: int) -> Iterator[tuple[np.ndarray, int]]:
    """The windows over `chunks`' ids: (block + 1 ids, fewer in the last; the offset its new
    targets start at), from a buffer of at most one chunk and one window."""
    step = block - min_context
    buf = np.zeros(0, dtype=np.int64)  # the ids from the next window's start on
    first = True
    for ids in chunks:
        buf = np.concatenate([buf, np.asarray(ids, dtype=np.int64)])
        while len(buf) > block:
            yield buf[:block + 1], 0 if first else min_context
            first = False
            buf = buf[step:]
    scored = 0 if first else min_context  # targets of `buf` already scored: 1..scored
    if len(buf) - 1 > scored:
        yield buf, scored


@torch.inference_mode()
def score_windows(model: GPT, windows: Iterable[tuple[np.ndarray, int]],
                  batch_size: int = WINDOWS_PER_FORWARD) -> tuple[float, int]:
    """(total nats, targets scored) of `stream_windows`' windows, `batch_size` a forward."""
    model.eval()
    device = model.wte.weight.device
    total, count, batch = 0.0, 0, []

    def forward(rows: list[tuple[np.ndarray, int]]) -> None:
        nonlocal total, count
        if not rows:
            return
        ids = torch.from_numpy(np.stack([r for r, _ in rows])).to(device)  # (B, n + 1)
        # summed on the CPU in float64 (MPS has none): one copy a batch, not a device wait a row
        logp = torch.log_softmax(model(ids[:, :-1])[0].float(), dim=-1)  # (B, n, V)
        nll = -logp.gather(-1, ids[:, 1:, None])[..., 0].cpu()  # (B, n)
        for row, (_, offset) in enumerate(rows):
            total += nll[row, offset:].sum(dtype=torch.float64).item()
            count += nll.size(1) - offset

    for window in windows:
        last = len(window[0]) <= model.cfg.block_size  # the shorter last window goes alone
        if last:
            forward(batch)
            batch = []
        batch.append(window)
        if last or len(batch) == batch_size:
            forward(batch)
            batch = []
    forward(batch)
    return total, count


def window_context(model: GPT, min_context: int | None) -> int:
    """The windows' `min_context` (default: half the block), below block_size so each window
    scores a new character, once the device has the memory (the same for any text length)."""
    block = model.cfg.block_size
    min_context = block // 2 if min_context is None else min_context
    if not 0 <= min_context < block:
        raise SettingError(Setting("stride"), f" must be in [0, {block - 1}] for block_size "
                           f"{block}, got {min_context}")
    need = scoring_bytes(model.cfg, model.vocab_size, CHUNK_BYTES + block + 1,
                         WINDOWS_PER_FORWARD, WINDOWS_PER_FORWARD)
    require_memory(need, model.wte.weight.device,
                   f"scoring needs about {{gib}} for a forward of {WINDOWS_PER_FORWARD} windows of "
                   f"{block}", "free memory on the device, or score on another --device")
    return min_context


def score_stream(model: GPT, vocab: Vocab, chunks: Iterable[bytes | np.ndarray],
                 min_context: int | None = None, unknown: str = "error") -> Score:
    """Score the text of code points `chunks`; unknown characters: an error, or (`skip`) dropped."""
    check_unknown_policy(unknown)
    min_context = window_context(model, min_context)
    tally = Unknown()
    ids = known_ids(chunks, vocab, tally, stop=unknown == "error")
    total, count = score_windows(model, stream_windows(ids, model.cfg.block_size, min_context))
    if tally.count and unknown == "error":
        raise tally.error()
    if count == 0:
        raise CharlmError("the text needs at least two characters the model knows to be scored")
    return _score(total, count, tally.count)


def score_text(model: GPT, vocab: Vocab, text: str, min_context: int | None = None,
               unknown: str = "error", progress: bool = True) -> Score:
    """`score_stream` of `text` in the normal form of the model's data, a slice at a time."""
    text = vocab.normalized(text)
    with _bar(len(text), "char", progress) as bar:
        chunks = map(narrow_code_points, _slices(text, bar))
        return score_stream(model, vocab, chunks, min_context, unknown)


def score_file(model: GPT, vocab: Vocab, path: Path, min_context: int | None = None,
               unknown: str = "error", progress: bool = True) -> Score:
    """Score the text file at `path` (`-`: stdin) as `prepare` reads it; a regular file is read
    twice, first to find what would end the pass before anything is scored."""
    if str(path) == "-":
        return _score_binary(model, vocab, sys.stdin.buffer, "<stdin>", None, min_context,
                             unknown, progress)
    check_unknown_policy(unknown)
    check_input_file(path)
    source = Source(path, str(path), path.name)
    with open_regular(path, "text file") as raw:
        f = raw if source.codec is None else CODECS[source.codec](raw)
        try:
            tally = Unknown()
            for _ in known_ids(_code_points(f, str(path), vocab), _reading(vocab), tally,
                               stop=True):
                pass
            if tally.count and unknown == "error":
                raise tally.error()
            f.seek(0)
            size = os.fstat(raw.fileno()).st_size if source.codec is None else None
            return _score_binary(model, vocab, f, str(path), size, min_context, unknown,
                                 progress)
        except READ_ERRORS as e:
            if source.codec is None:
                raise
            raise source.damaged(e) from None


def _code_points(f: Any, name: str, vocab: Vocab, bar: tqdm | None = None) -> Iterator[Any]:
    """The file's code points as `prepare` reads them; a byte model's are its raw bytes."""
    return (cps for _, cps in code_point_chunks(f, name, bar, vocab.normalize, vocab.units))


def _reading(vocab: Vocab) -> Vocab:
    """The vocabulary `_code_points` are read by: a byte model's, as characters of its bytes."""
    return Vocab(vocab.chars, "char") if vocab.units == "byte" else vocab


def _score_binary(model: GPT, vocab: Vocab, f: Any, name: str, size: int | None,
                  min_context: int | None, unknown: str, progress: bool) -> Score:
    with _bar(size, "B", progress) as bar:
        return score_stream(model, _reading(vocab), _code_points(f, name, vocab, bar),
                            min_context, unknown)


def score_ids(model: GPT, ids: np.ndarray, min_context: int | None = None,
              progress: bool = True) -> Score:
    """Score the ids of a dataset's split (a memmap), a chunk at a time."""
    min_context = window_context(model, min_context)
    with _bar(len(ids), "id", progress) as bar:
        chunks = _slices(ids, bar)
        total, count = score_windows(model, stream_windows(chunks, model.cfg.block_size,
                                                           min_context))
    if count == 0:
        raise CharlmError("the split needs at least two ids to be scored")
    return _score(total, count, 0)


def _bar(total: int | None, unit: str, progress: bool) -> tqdm:
    # disable=None: only on a terminal; delay: not for a text scored in a second
    return tqdm(total=total, unit=unit, unit_scale=True, desc="eval", delay=1.0,
                disable=None if progress else True)


def _slices(seq: Any, bar: tqdm) -> Iterator[Any]:
    """`seq` (a text, an array) a CHUNK_BYTES slice at a time, each counted on `bar`."""
    for i in range(0, len(seq), CHUNK_BYTES):
        bar.update(min(CHUNK_BYTES, len(seq) - i))
        yield seq[i:i + CHUNK_BYTES]


def _score(total: float, count: int, skipped: int) -> Score:
    loss = total / count
    if math.isnan(loss):  # finite weights whose logits overflow: no score to give
        raise NonFiniteOutput("score")
    try:
        perplexity = math.exp(loss)
    except OverflowError:  # a loss past about 709 nats (a diverged model)
        perplexity = math.inf
    return Score(loss, loss / math.log(2), perplexity, count, skipped)


def finite_or_none(value: Any) -> Any:
    """None for a float that strict JSON cannot hold (a NaN loss, an infinite best)."""
    return None if isinstance(value, float) and not math.isfinite(value) else value
