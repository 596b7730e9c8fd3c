"""Text datasets: `prepare` (text files -> meta.json + train.bin + val.bin), the input checks
and the reading of meta.json; loading a dataset dir back is `charlm.data.datasets`'.

The corpus is read in two passes of fixed-size chunks (`charlm.data.chunks`): pass 1 (`scan`):
sha256, character count and the set of characters; pass 2 (`encode_source`): the ids, and
sha256 again, to catch a file that changed between the passes. Memory stays bounded whatever
the size, and every step is a bytes or numpy operation over a whole chunk. Also where the
validation split falls (`train_counts`): the tail of each file, or whole files. It imports no
torch, so `charlm prepare` starts fast."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import stat
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from tqdm import tqdm

from charlm.core.errors import CharlmError, characters, warn
from charlm.core.files import (
    locked_dir,
    make_writable_dir,
    missing,
    open_regular,
    read_capped,
    read_regular,
    remove_temps,
    some,
    temp_beside,
    write_text_atomic,
)
from charlm.data.chunks import (
    SKIP_HINT,
    InvalidText,
    byte_chunks,
    code_point_chunks,
    decode_chunks,
    sha256_file,
)
from charlm.data.sources import READ_ERRORS, Source, listed, unreadable
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
    units: str = "char"  # "byte": the ids are the files' bytes (`charlm.data.vocab`)

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
    """Where `key` falls in [0, 1), by its sha256: a file's path under its folder stays on its
    side of data.split files whatever other files come and go (a pair's source likewise)."""
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


DATASET_FORMAT = "charlm-dataset"

DATASET_FILES = ("meta.json", "train.bin", "val.bin", "test.bin")  # test: a benchmark's

DATASET_VERSION = 1

PROGRESS_MIN_BYTES = 4 << 20

# meta.json (and an export's vocab.json) hold a vocabulary: even every Unicode character, one a
# line, stays below this; a file far larger is not charlm's and would fill the memory
META_LIMIT = 16 << 20


def check_input_file(path: Path) -> None:
    if not path.exists():
        raise missing(path, "input file")
    if path.is_dir():
        raise CharlmError(f"input is a directory, not a text file: {path}")


def read_text(path: Path, what: str = "text file", limit: int | None = None) -> str:
    """A whole text file, read strictly as UTF-8 (with the same errors as `prepare`): a
    regular file (named `what` in errors), of at most `limit` bytes if given; `-` is stdin."""
    if str(path) == "-":
        stdin = sys.stdin.buffer
        source = stdin if limit is None else io.BytesIO(read_capped(stdin, limit, "stdin"))
        return "".join(text for _, text in decode_chunks(source, "<stdin>"))
    path = Path(path)
    check_input_file(path)
    with open_regular(path, what, limit) as f:
        # with a limit, a file that grows while it is read stops at it too
        source = f if limit is None else io.BytesIO(read_capped(f, limit, f"{what} {path}"))
        return "".join(text for _, text in decode_chunks(source, str(path)))


def read_meta(path: Path) -> Any:
    """The parsed meta.json of the directory `path`, whatever JSON it holds. Raises OSError
    (FileNotFoundError when there is none) or ValueError (not JSON, not UTF-8)."""
    return json.loads(read_regular(path / "meta.json", "dataset metadata", META_LIMIT)
                      .decode("utf-8"))


def check_meta_header(meta: Any) -> None:
    """Raise ValueError unless a dataset's meta.json is charlm's, of the version read here."""
    if not isinstance(meta, dict) or meta.get("format") != DATASET_FORMAT:
        raise ValueError("not a charlm dataset")
    if meta.get("version") != DATASET_VERSION:
        raise ValueError(f"dataset format version {meta.get('version')}")


def dataset_meta(path: Path) -> dict[str, Any] | None:
    """The meta.json of the directory `path` if it is a charlm dataset's, else None (missing,
    unreadable, or another tool's)."""
    try:
        meta = read_meta(path)
    except (ValueError, OSError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == DATASET_FORMAT else None


def replaceable(out: Path) -> bool:
    """Whether `prepare` may write into the existing directory `out`: one that holds a charlm
    dataset (its meta.json says so: a meta.json of another tool is not ours to overwrite), or
    nothing but dataset files and the hidden .NAME.tmp-PID files of a killed prepare, with a
    meta.json missing or damaged (a prepare or a machine stopped between moving the .bin files
    into place and writing meta.json, say in a run's own dataset cache)."""
    if dataset_meta(out) is not None:
        return True
    if not all(p.name.startswith(".") or p.name in DATASET_FILES for p in out.iterdir()):
        return False
    try:  # only dataset files: replaceable unless meta.json is another tool's
        read_meta(out)
    except FileNotFoundError:
        return True
    except (ValueError, OSError):  # damaged (cut short by a crash) beside our .bin files
        return any((out / name).exists() for name in ("train.bin", "val.bin"))
    return False


def dataset_lock(out: Path) -> contextlib.AbstractContextManager[None]:
    """The lock a prepare holds on its dataset dir (`locked_dir`), so that two prepares into
    one dir never mix one's meta.json with the other's data files."""
    return locked_dir(out, f"dataset dir {out} is in use by another `charlm prepare` (or a "
                           "`charlm train` preparing its data); wait for it to end, or choose "
                           "another --out")


def install(out: Path, finals: Iterable[Path], meta: dict[str, Any]) -> None:
    """Move the written temporaries (`temp_beside`) of a dataset's `finals` into place, then
    write its meta.json. The old meta.json goes first: stopped between the moves, the dir holds
    no meta.json beside a mix of old and new files, which no reader takes for a dataset."""
    (out / "meta.json").unlink(missing_ok=True)
    for path in finals:
        os.replace(temp_beside(path), path)
    write_text_atomic(out / "meta.json", json.dumps(meta, ensure_ascii=False, indent=1))


def discard_temps(finals: Iterable[Path]) -> None:
    """Remove the temporaries of `finals` that a stopped prepare wrote (while it is stopping:
    an OSError here must not hide the error being raised)."""
    for path in finals:
        with contextlib.suppress(OSError):
            temp_beside(path).unlink(missing_ok=True)


def remove_killed_temps(out: Path, names: Sequence[str]) -> None:
    """Remove the .NAME.tmp-PID files of `names` in `out` that a killed process left."""
    for name in names:
        remove_temps(out / name, only_dead=True)


def prepare(
    inputs: Sequence[str | Path], out: str | Path, val_fraction: float = 0.1,
    progress: bool = True, options: TextOptions = TextOptions(), base: Vocab | None = None,
) -> dict[str, Any]:
    """Encode text files (and folders, globs, compressed files, `-`: `charlm.data.sources`) into
    a dataset directory; returns the metadata written to meta.json.

    The validation split is the last `val_fraction` of each input, so the split of one file is
    the same as nanoGPT's (`n_train = int(n * (1 - val_fraction))`), or with options.split
    "files" whole files chosen by a hash of their path (`held_out`). It holds the dataset dir's
    lock throughout, and whatever stops it (an error, SIGINT, SIGTERM) removes its temporaries.
    With a `base` vocabulary (a fine-tuned model's) the ids are its own, the text's new
    characters after them, and meta.json records it as "base". In byte units (options.units)
    the ids are the files' bytes (`charlm.data.vocab`).
    """
    with listed(inputs, options.include, options.exclude) as sources:
        return prepare_sources(sources, out, val_fraction, progress, options, base)


def prepare_sources(sources: Sequence[Source], out: str | Path, val_fraction: float = 0.1,
                    progress: bool = True, options: TextOptions = TextOptions(),
                    base: Vocab | None = None) -> dict[str, Any]:
    """`prepare` of the files `sources` (`charlm.data.sources.list_sources`)."""
    out = Path(out)
    with dataset_lock(out):
        check_prepare(sources, out, val_fraction)
        total = sum(s.path.stat().st_size for s in sources)
        bar = tqdm(total=2 * total, unit="B", unit_scale=True, desc="prepare",
                   disable=True if not progress or total < PROGRESS_MIN_BYTES else None)
        final = {split: out / f"{split}.bin" for split in ("train", "val")}
        try:
            stats, skipped, vocab = scan(sources, options, bar)
            vocab = vocab if base is None else base.extended(vocab.chars)
            n_train = train_counts(stats, val_fraction, options.split)
            make_writable_dir(out, f"dataset dir {out}")
            remove_killed_temps(out, DATASET_FILES)
            sizes = write_splits(stats, n_train, vocab, final, options, bar)
            meta = {
                "format": DATASET_FORMAT,
                "version": DATASET_VERSION,
                "vocab": vocab.chars,
                "vocab_size": len(vocab),
                "dtype": vocab.dtype.name,
                "val_fraction": val_fraction,
                **options.to_dict(),
                "train_tokens": sizes["train"],
                "val_tokens": sizes["val"],
                **listed_sources(stats, n_train, skipped),
                **({} if base is None else {"base": base.chars}),
            }
            install(out, final.values(), meta)
            (out / "test.bin").unlink(missing_ok=True)  # of a benchmark this one replaced
        except BaseException as e:
            discard_temps(final.values())
            if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CharlmError(f"cannot write dataset {out}: {e.strerror} (it needs about "
                                  f"{total / 2**20:,.0f} MiB or more); nothing was kept of the "
                                  "new dataset and what was there is as it was, free disk space "
                                  "or give another --out") from None
            raise
        finally:
            bar.close()
    return meta


def listed_sources(stats: Sequence[SourceStats], n_train: Sequence[int],
                   skipped: Sequence[Skipped]) -> dict[str, list[dict[str, Any]]]:
    """meta.json's lists of the sources read and of those skipped (with `--skip-invalid`)."""
    return {
        "sources": [source_entry(s.source, s.bytes, s.sha256, chars=s.chars, split=split_name(s, n))
                    for s, n in zip(stats, n_train, strict=True)],
        "skipped": [source_entry(k.source, k.source.path.stat().st_size,
                                 sha256_file(k.source.path), reason=k.reason) for k in skipped],
    }


def check_prepare(sources: Sequence[Source], out: Path, val_fraction: float) -> None:
    """`prepare`'s refusals, before it reads anything: a split fraction outside (0, 1), an
    input that is not a regular file, an --out that is a file or a non-empty directory that
    holds no dataset."""
    if not 0 < val_fraction < 1:
        raise CharlmError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    for s in sources:
        check_source_file(s.path, s.name)  # before reading any sizes
    check_out(out)


def check_out(out: Path, writable: Callable[[Path], bool] = replaceable) -> None:
    """An --out that may be written: new, or a directory that is `writable` (empty, or a
    dataset's); a file or a directory of something else is refused."""
    if out.exists() and not out.is_dir():
        raise CharlmError(f"--out must be a directory, but {out} is a file")
    if out.is_dir() and not writable(out):
        raise CharlmError(f"--out {out} is not empty and holds no charlm dataset; give a new or "
                          "empty directory, or a dataset dir to replace")


def write_splits(stats: Sequence[SourceStats], n_train: Sequence[int], vocab: Vocab,
                 final: dict[str, Path], options: TextOptions, bar: tqdm) -> dict[str, int]:
    """Encode each source's first n_train characters into the temp file beside final["train"]
    and the rest beside final["val"], synced to disk; the tokens written to each."""
    sizes = {"train": sum(n_train), "val": sum(s.chars for s in stats) - sum(n_train)}
    with (open(temp_beside(final["train"]), "wb") as ftrain,
          open(temp_beside(final["val"]), "wb") as fval):
        for s, n in zip(stats, n_train, strict=True):
            encode_source(s, vocab, [n], [ftrain, fval], options, bar)
        for f in (ftrain, fval):
            f.flush()
            os.fsync(f.fileno())
    return sizes
