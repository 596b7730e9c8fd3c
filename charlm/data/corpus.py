"""A corpus: the text files a dataset is made of (`charlm.data.sources`), read the way
`prepare` reads them, in two passes of fixed-size chunks (`charlm.data.chunks`). Pass 1
(`scan`): sha256, character count and the set of characters; pass 2 (`encode_source`): the ids,
and sha256 again, to catch a file that changed between the passes. Memory stays bounded
whatever the size, and every step is a bytes or numpy operation over a whole chunk. Also where
the validation split falls (`train_counts`): the tail of each file, or whole files.
"""

from __future__ import annotations

import hashlib
import stat
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from charlm.core.errors import CharlmError, characters, warn
from charlm.core.files import some
from charlm.data.chunks import SKIP_HINT, InvalidText, byte_chunks, code_point_chunks
from charlm.data.sources import READ_ERRORS, Source, unreadable
from charlm.data.vocab import CharacterSet, Vocab


def check_source_file(path: Path, name: str | None = None) -> None:
    """An input of `prepare` (named `name` in errors), which reads it twice (pass 1, pass 2): a
    regular file. A pipe (`<(cmd)`) gives its bytes once, so pass 2 would write no ids, and a
    named pipe blocks."""
    name = str(path) if name is None else name
    try:
        regular = stat.S_ISREG(path.stat().st_mode)
    except OSError as e:
        raise unreadable(Source(path, name, name), e) from None
    if not regular:
        raise CharlmError(f"input is not a regular file (a pipe or a device): {name}; "
                          "charlm reads its text twice: give it as - (stdin), or save it to a "
                          "file first")


@dataclass(frozen=True)
class TextOptions:
    """How `prepare` finds, reads and splits its inputs, beside the val fraction: the
    data.split, skip_invalid, include, exclude and unicode_normalize keys of a run."""

    split: str = "tail"  # "tail": the last val_fraction of each input; "files": whole files
    skip_invalid: bool = False
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    normalize: str | None = None
    units: str = "char"  # "byte": the ids are the files' bytes (`charlm.data.units`)

    def to_dict(self) -> dict[str, Any]:
        return {"units": self.units, "split": self.split, "skip_invalid": self.skip_invalid,
                "include": list(self.include), "exclude": list(self.exclude),
                "unicode_normalize": self.normalize}


@dataclass
class SourceStats:
    source: Source
    bytes: int  # as stored (compressed, for a .gz)
    chars: int
    sha256: str  # of the bytes as stored


@dataclass
class Skipped:
    source: Source
    reason: str


def _read(source: Source, options: TextOptions, each: Callable[[bytes | np.ndarray], None],
          bar: tqdm | None) -> SourceStats:
    """Read `source` once, giving `each` the code points (in byte units, the bytes) of every
    chunk; its stats."""
    chars = 0
    with source.open(bar) as (f, tap):
        chunks = (byte_chunks(f) if options.units == "byte" else
                  code_point_chunks(f, source.name, normalize=options.normalize))
        while True:
            try:  # only the reading: an OSError of `each` (a full disk) is not the input's
                _, cps = next(chunks)
            except StopIteration:
                break
            except READ_ERRORS as e:
                raise (source.damaged(e) if source.codec else unreadable(source, e)) from None
            each(cps)
            chars += len(cps)
        return SourceStats(source, tap.size, chars, tap.hexdigest())


def scan(sources: Sequence[Source], options: TextOptions = TextOptions(),
         bar: tqdm | None = None) -> tuple[list[SourceStats], list[Skipped], Vocab]:
    """Pass 1 over every input: per-file stats, the inputs skipped (`options.skip_invalid`) and
    the vocabulary of all the others together."""
    seen = CharacterSet()
    stats, skipped = [], []
    for source in sources:
        seen.begin()
        try:
            s = _read(source, options, seen.add, bar)
            if s.chars == 0:
                raise InvalidText(f"input file is empty: {source.name}; give it some text to "
                                  "learn from", "empty")
            stats.append(s)
        except InvalidText as e:
            if not options.skip_invalid:
                raise CharlmError(f"{e}, {SKIP_HINT}") from None
            seen.undo()  # the characters of the chunks read before the fault
            skipped.append(Skipped(source, e.reason))
    if not stats:
        raise CharlmError(f"no text to learn from: all {len(sources):,} inputs were skipped "
                          f"({count_reasons(skipped)}); give UTF-8 text files")
    vocab = seen.vocab(options.units)
    if len(vocab) < 2:
        raise CharlmError(
            f"{some([s.source.name for s in stats])} holds only one distinct character "
            f"({vocab.chars[0]!r}); a language model needs at least two, give it real text"
        )
    return stats, skipped, vocab


def count_reasons(skipped: Sequence[Skipped | dict[str, Any]]) -> str:
    """`3 empty, 1 not UTF-8`: how many inputs were skipped, by reason (of `scan`'s `Skipped`,
    or meta.json's "skipped" entries)."""
    counts = Counter(s["reason"] if isinstance(s, dict) else s.reason for s in skipped)
    return ", ".join(f"{n:,} {reason}" for reason, n in sorted(counts.items()))


def encode_source(s: SourceStats, vocab: Vocab, ends: Sequence[int], files: Sequence[BinaryIO],
                  options: TextOptions, bar: tqdm | None) -> None:
    """Pass 2 over one input: its ids to `files` in turn, the first `ends[0]` to the first, up
    to `ends[1]` to the second, and so on, the rest to the last. What it reads must be what
    pass 1 read (`s`: the same characters and sha256), else the file changed."""
    done = 0

    def write(cps: bytes | np.ndarray) -> None:
        nonlocal done
        try:
            ids = memoryview(vocab.encode_code_points(cps))  # bytes or an array
        except CharlmError:  # a character the first read did not see
            raise changed_while_read(s.source.name) from None
        start = 0
        for f, end in zip(files, [*ends, done + len(ids)], strict=True):  # each file's part
            cut = min(max(end - done, start), len(ids))
            f.write(ids[start:cut])
            start = cut
        done += len(ids)

    try:
        again = _read(s.source, options, write, bar)
    except InvalidText:
        raise changed_while_read(s.source.name) from None
    if (again.chars, again.sha256) != (s.chars, s.sha256):
        raise changed_while_read(s.source.name)


def changed_while_read(path: str) -> CharlmError:
    return CharlmError(f"{path} changed while prepare read it (the two reads differ); run it "
                       "again once nothing writes to the file")


def source_entry(source: Source, size: int, sha256: str, **more: Any) -> dict[str, Any]:
    """A source as meta.json lists it: the key of the cache (`same_sources`) and `more`."""
    return {"path": source.name, "bytes": size, "sha256": sha256, **more}


def split_name(s: SourceStats, n_train: int) -> str:
    return "train" if n_train == s.chars else "val" if n_train == 0 else "tail"


def path_share(key: str) -> float:
    """Where the file at `key` (its path under its folder) falls in [0, 1): a hash of the path,
    so a file stays on its side of data.split files whatever other files come and go."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def held_out(key: str, val_fraction: float) -> bool:
    """Whether data.split files holds out the file at `key`."""
    return path_share(key) < val_fraction


def train_counts(stats: Sequence[SourceStats], val_fraction: float, split: str) -> list[int]:
    """How many characters of each source go to the train split; the rest are validation. A
    split that leaves either side empty is refused (nothing to train on, or to measure); one
    of whole files that holds out less than half or more than twice the val fraction of the
    text is warned about (two files hold out 25 % or 75 % of it)."""
    if split == "files":
        if len(stats) < 2:
            raise CharlmError("data.split files holds out whole files, but there is only one "
                              "input file; give several, or use data.split tail")
        val = [held_out(s.source.key, val_fraction) for s in stats]
        if all(val) or not any(val):  # few files: the one with the smallest hash goes over
            first = min(range(len(stats)), key=lambda i: path_share(stats[i].source.key))
            val = [i == first for i in range(len(stats))]
        counts = [0 if v else s.chars for s, v in zip(stats, val, strict=True)]
    else:
        counts = [int(s.chars * (1 - val_fraction)) for s in stats]
    n_train, total = sum(counts), sum(s.chars for s in stats)
    if n_train < 2 or n_train == total:
        side = "train" if n_train < 2 else "validation"
        left = characters(n_train if n_train < 2 else 0)
        raise CharlmError(f"--val-fraction {val_fraction} leaves {left} for {side} of "
                          f"{characters(total)}; choose a fraction that leaves both splits "
                          "some text, or give more text")
    share = 1 - n_train / total
    if split == "files" and not val_fraction / 2 <= share <= val_fraction * 2:
        held = sum(1 for c in counts if c == 0)
        warn(f"data.split files holds out {held:,} of {len(stats):,} files, {share:.0%} of the "
             f"text, for validation, not the {val_fraction:.0%} of the val fraction: whole "
             "files go to one side; give more files, or use data.split tail")
    return counts
