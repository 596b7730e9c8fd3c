"""Text datasets: `prepare` (text files -> meta.json + train.bin + val.bin), the input checks
and the reading of meta.json. Loading a dataset dir back is `charlm.data.dataset`'s.

`prepare` reads each input twice in fixed-size chunks (`charlm.data.corpus`), so memory stays
bounded whatever the size of the files. It imports no torch, so `charlm prepare` starts fast.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from charlm.core.errors import CharlmError
from charlm.core.files import (
    locked_dir,
    make_writable_dir,
    missing,
    open_regular,
    read_capped,
    read_regular,
    remove_temps,
    temp_beside,
    write_text_atomic,
)
from charlm.data.chunks import decode_chunks
from charlm.data.corpus import (
    Skipped,
    SourceStats,
    TextOptions,
    check_source_file,
    encode_source,
    scan,
    source_entry,
    split_name,
    train_counts,
)
from charlm.data.digest import sha256_file
from charlm.data.sources import Source, listed
from charlm.data.vocab import Vocab

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
    the ids are the files' bytes (`charlm.data.units`).
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
    if out.exists() and not out.is_dir():
        raise CharlmError(f"--out must be a directory, but {out} is a file")
    if out.is_dir() and not replaceable(out):
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
