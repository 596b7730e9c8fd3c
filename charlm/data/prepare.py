"""`charlm prepare`: text files, or pairs files, into a dataset dir. Text is read in two passes
of chunks, so memory stays bounded whatever its size: pass 1 (`scan`) finds each file's sha256,
its characters and the vocabulary, pass 2 (`encode_source`) writes the ids and hashes again, to
catch a file that changed between the passes."""

from __future__ import annotations

import errno
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from charlm.config.data import DataConfig, TextOptions
from charlm.core.errors import CharlmError, characters, warn
from charlm.core.files import some
from charlm.data.chunks import CharacterSet, InvalidText, code_point_chunks, path_share, sha256_file
from charlm.data.dataset_dir import (
    DATASET_FILES,
    META_HEADER,
    PAIR_FILES,
    PAIRS_KIND,
    SPLITS,
    check_out,
    dataset_lock,
    source_entry,
    text_meta,
    write_dataset,
)
from charlm.data.pairs import PairSplit, PairVocab, pair_settings, read_pairs, split_of
from charlm.data.sources import READ_ERRORS, Source, check_source_file, listed, unreadable
from charlm.data.vocab import Vocab

# what `prepare` adds to an `InvalidText`'s message
SKIP_HINT = "or pass --skip-invalid (data.skip_invalid) to skip such files"

PROGRESS_MIN_BYTES = 4 << 20


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
    """Read `source` once, giving `each` the code points (byte units: the bytes) of every chunk."""
    chars = 0
    with source.open(bar) as (f, tap):
        chunks = code_point_chunks(f, source.name, None, options.normalize, options.units)
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
    """Pass 1: per-file stats, the inputs skipped and the vocabulary of all the others."""
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
    """`3 empty, 1 not UTF-8`: the inputs skipped (`Skipped`, or meta.json's entries) by reason."""
    counts = Counter(s["reason"] if isinstance(s, dict) else s.reason for s in skipped)
    return ", ".join(f"{n:,} {reason}" for reason, n in sorted(counts.items()))


def encode_source(s: SourceStats, vocab: Vocab, ends: Sequence[int], files: Sequence[BinaryIO],
                  options: TextOptions, bar: tqdm | None) -> None:
    """Pass 2 over one input: its first `ends[0]` ids to the first of `files`, up to `ends[1]`
    to the second, and so on, the rest to the last; what it reads must be what pass 1 read."""
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


def train_counts(stats: Sequence[SourceStats], val_fraction: float, split: str) -> list[int]:
    """How many characters of each source go to the train split, the rest to validation: refused
    if either side is empty, warned about for whole files as data.split's help says."""
    if split == "files":
        if len(stats) < 2:
            raise CharlmError("data.split files holds out whole files, but there is only one "
                              "input file; give several, or use data.split tail")
        val = [path_share(s.source.key) < val_fraction for s in stats]
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


def prepare(inputs: Sequence[str | Path], out: str | Path, val_fraction: float = 0.1,
            progress: bool = True, options: TextOptions = TextOptions()) -> dict[str, Any]:
    """Encode text files (folders, globs, compressed files, `-`) into a dataset dir; its meta.json.
    Validation: the last `val_fraction` of each input (nanoGPT's), or whole files (`split`)."""
    with listed(inputs, options.include, options.exclude) as sources:
        return prepare_sources(sources, out, val_fraction, progress, options)


def prepare_sources(sources: Sequence[Source], out: str | Path, val_fraction: float = 0.1,
                    progress: bool = True, options: TextOptions = TextOptions(),
                    base: Vocab | None = None,
                    check: Callable[[Vocab], None] | None = None) -> dict[str, Any]:
    """`prepare` of the files `sources`, holding the dataset dir's lock throughout. With a
    `base` vocabulary (a fine-tuned model's) the ids are its own, the text's new characters
    after them; `check` sees the vocabulary before anything is written."""
    out = Path(out)
    with dataset_lock(out):
        check_prepare(sources, out, val_fraction)
        total = sum(s.path.stat().st_size for s in sources)
        with tqdm(total=2 * total, unit="B", unit_scale=True, desc="prepare",
                  disable=True if not progress or total < PROGRESS_MIN_BYTES else None) as bar:
            stats, skipped, vocab = scan(sources, options, bar)
            vocab = vocab if base is None else base.extended(vocab.chars)
            if check is not None:
                check(vocab)
            n_train = train_counts(stats, val_fraction, options.split)
            split = ["train" if n == s.chars else "val" if n == 0 else "tail"
                     for s, n in zip(stats, n_train, strict=True)]
            meta = text_meta(
                vocab, val_fraction, options.to_dict(),
                {"train": sum(n_train), "val": sum(s.chars for s in stats) - sum(n_train)},
                sources=[source_entry(s.source, s.bytes, s.sha256, chars=s.chars, split=where)
                         for s, where in zip(stats, split, strict=True)],
                skipped=[source_entry(k.source, k.source.path.stat().st_size,
                                      sha256_file(k.source.path), reason=k.reason)
                         for k in skipped],
                **({} if base is None else {"base": base.chars}))

            def write(files: list[BinaryIO]) -> None:
                for s, n in zip(stats, n_train, strict=True):
                    encode_source(s, vocab, [n], files, options, bar)

            try:
                write_dataset(out, [out / "train.bin", out / "val.bin"], write, meta,
                              stale=["test.bin"])  # of a benchmark this one replaced
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise CharlmError(f"cannot write dataset {out}: {e.strerror} (it needs about "
                                      f"{total / 2**20:,.0f} MiB or more); nothing was kept of "
                                      "the new dataset and what was there is as it was, free "
                                      "disk space or give another --out") from None
                raise
    return meta


def check_prepare(sources: Sequence[Source], out: Path, val_fraction: float) -> None:
    """`prepare`'s refusals, before it reads anything."""
    if not 0 < val_fraction < 1:
        raise CharlmError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    for s in sources:
        check_source_file(s.path, s.name)  # before reading any sizes
    check_out(out)


def prepare_pairs(inputs: Sequence[Path], out: Path, data: DataConfig, block_size: int,
                  check: Callable[[PairVocab], None] | None = None,
                  base: PairVocab | None = None) -> dict[str, Any]:
    """Read pair files, split them by source and write a dataset dir, holding its lock; returns
    its meta.json. `check` and `base` as `prepare_sources`'s."""
    paths, out = [Path(p) for p in inputs], Path(out)
    with dataset_lock(out):
        if not paths:
            raise CharlmError("no input files given")
        for p in paths:
            check_source_file(p)
        check_out(out, PAIR_FILES)
        # hashed before reading: a file changed meanwhile makes a cache that is rebuilt
        hashes = [sha256_file(p) for p in paths]
        read = [read_pairs(p, data, block_size) for p in paths]
        pairs = [pair for got, _ in read for pair in got]
        vocab = PairVocab.from_pairs(pairs, data.target_units)  # all splits: eval meets no unknown
        vocab = vocab if base is None else base.extended(vocab)
        splits: dict[str, list[tuple[str, str]]] = {split: [] for split in SPLITS}
        for pair in pairs:
            splits[split_of(pair[0], data.val_fraction, data.test_fraction)].append(pair)
        names = ", ".join(str(p) for p in paths)
        if not splits["train"]:
            raise CharlmError(f"no source of {names} falls in the train split; lower "
                              f"data.val_fraction ({data.val_fraction}) or data.test_fraction "
                              f"({data.test_fraction})")
        if not splits["val"]:
            raise CharlmError(f"no source of {names} falls in the val split; raise "
                              f"data.val_fraction ({data.val_fraction}) or give more pairs")
        if check is not None:
            check(vocab)
        meta = {
            **META_HEADER, "kind": PAIRS_KIND, "vocab": vocab.to_dict(),
            **pair_settings(data, block_size),
            "skipped": sum(n for _, n in read),
            "sources": [{"path": str(p), "sha256": h, "pairs": len(got), "skipped": n}
                        for p, h, (got, n) in zip(paths, hashes, read, strict=True)],
            "pairs": {split: len(got) for split, got in splits.items()},
            **({} if base is None else {"base": base.to_dict()}),
        }

        def write(files: list[BinaryIO]) -> None:
            for f, split in zip(files, SPLITS, strict=True):
                np.savez(f, **vars(PairSplit.encode(splits[split], vocab)))

        write_dataset(out, [out / f"{split}.npz" for split in SPLITS], write, meta,
                      stale=DATASET_FILES[1:])  # the .bin files of a text dataset replaced
    return meta
