"""A dataset dir, as `charlm prepare` writes it and every reader opens it: what marks one as
charlm's (meta.json's format and version), reading meta.json, writing a dataset safely (the
dir's lock, whether an existing dir may be replaced, the data files moved into place before
meta.json), and loading one back, checked: `load_dataset` (text: train.bin, val.bin as memmaps)
and `load_pairs` (pairs: train.npz, val.npz, test.npz). `path_share`: the hash that keeps a
file (data.split files) or a pair's source on its side of a split.

A pairs dataset dir holds meta.json (kind "pairs") and train.npz, val.npz and test.npz, each
with the flat ids of all its sources (`src`) and targets (`tgt`) and their int64 offsets: pair
i's source is src[src_offsets[i]:src_offsets[i + 1]]. Four arrays whatever the number of pairs,
and no pickles. It imports no torch, so `charlm prepare` starts fast."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from charlm.core.errors import CharlmError
from charlm.core.files import (
    locked_dir,
    make_writable_dir,
    read_regular,
    remove_killed_temps,
    temp_beside,
    write_text_atomic,
)
from charlm.data.pair_vocab import PairVocab
from charlm.data.vocab import Vocab

DATASET_FORMAT = "charlm-dataset"

DATASET_VERSION = 1

DATASET_FILES = ("meta.json", "train.bin", "val.bin", "test.bin")  # test: a benchmark's

PAIRS_KIND = "pairs"

SPLITS = ("train", "val", "test")

PAIR_FILES = ("meta.json", *(f"{split}.npz" for split in SPLITS))

ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets")

AGAIN = "prepare it again with `charlm prepare --pairs`"

# meta.json (and an export's vocab.json) hold a vocabulary: even every Unicode character, one a
# line, stays below this; a file far larger is not charlm's and would fill the memory
META_LIMIT = 16 << 20


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


def make_dataset_dir(out: Path, names: Sequence[str]) -> None:
    """Make the dataset dir `out` if needed and check that it can be written, then remove the
    temporaries of its files `names` that a killed process left there."""
    make_writable_dir(out, f"dataset dir {out}")
    remove_killed_temps(out, names)


def install(out: Path, finals: Iterable[Path], meta: dict[str, Any]) -> None:
    """Move the written temporaries (`temp_beside`) of a dataset's `finals` into place, then
    write its meta.json. The old meta.json goes first: stopped between the moves, the dir holds
    no meta.json beside a mix of old and new files, which no reader takes for a dataset."""
    (out / "meta.json").unlink(missing_ok=True)
    for path in finals:
        os.replace(temp_beside(path), path)
    write_text_atomic(out / "meta.json", json.dumps(meta, ensure_ascii=False, indent=1))


def check_out(out: Path, writable: Callable[[Path], bool] = replaceable) -> None:
    """An --out that may be written: new, or a directory that is `writable` (empty, or a
    dataset's); a file or a directory of something else is refused."""
    if out.exists() and not out.is_dir():
        raise CharlmError(f"--out must be a directory, but {out} is a file")
    if out.is_dir() and not writable(out):
        raise CharlmError(f"--out {out} is not empty and holds no charlm dataset; give a new or "
                          "empty directory, or a dataset dir to replace")


def is_dataset_dir(path: Path) -> bool:
    """Whether `path` is a prepared dataset dir (one with a meta.json), not a folder of text."""
    return path.is_dir() and (path / "meta.json").exists()


@dataclass
class Dataset:
    """A prepared dataset: its vocabulary and its splits as read-only memmaps (a test split
    only where meta.json gives "test_tokens": a benchmark's)."""

    path: Path
    meta: dict[str, Any]
    vocab: Vocab
    train: np.ndarray
    val: np.ndarray
    test: np.ndarray | None = None

    def split(self, name: str) -> np.ndarray | None:
        return {"train": self.train, "val": self.val, "test": self.test}[name]


def load_dataset(path: str | Path) -> Dataset:
    path = Path(path)
    if not (path / "meta.json").is_file():
        raise CharlmError(
            f"{path} is not a prepared dataset (no meta.json); "
            "give a text file or run `charlm prepare` first"
        )
    try:
        meta = read_meta(path)
        check_meta_header(meta)
        vocab = Vocab(meta["vocab"], meta.get("units", "char"), meta.get("unicode_normalize"))
        # The declared sizes must be the vocabulary's: a hand-edited one is not silently ignored.
        if meta["vocab_size"] != len(vocab):
            raise ValueError(f"meta.json gives vocab_size {meta['vocab_size']!r}, but its vocab "
                             f"holds {len(vocab)} characters")
        if meta["dtype"] != vocab.dtype.name:
            raise ValueError(f"meta.json gives dtype {meta['dtype']!r}, but a {len(vocab)}-symbol "
                             f"vocabulary has {vocab.dtype.name} ids")
        splits = {}
        for split in ("train", "val", "test")[:3 if "test_tokens" in meta else 2]:
            n = meta[f"{split}_tokens"]
            bin_path = path / f"{split}.bin"
            if bin_path.stat().st_size != n * vocab.dtype.itemsize:
                raise ValueError(f"{split}.bin does not match meta.json")
            splits[split] = (
                np.memmap(bin_path, dtype=vocab.dtype, mode="r") if n else
                np.zeros(0, dtype=vocab.dtype)
            )
            if n and int(splits[split].max()) >= len(vocab):  # one vectorised pass
                raise ValueError(f"{split}.bin holds ids outside the {len(vocab)}-symbol "
                                 "vocabulary of meta.json")
    except (ValueError, KeyError, TypeError, OSError, CharlmError) as e:
        raise CharlmError(
            f"cannot read dataset {path}: {e}; prepare it again with `charlm prepare`"
        ) from None
    return Dataset(path, meta, vocab, splits["train"], splits["val"], splits.get("test"))


@dataclass
class PairSplit:
    """The pairs of one split: flat ids and offsets (see the module docstring)."""

    src: np.ndarray
    src_offsets: np.ndarray
    tgt: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Source and target ids of pair `i`."""
        return (self.src[self.src_offsets[i]:self.src_offsets[i + 1]],
                self.tgt[self.tgt_offsets[i]:self.tgt_offsets[i + 1]])

    def lengths(self) -> np.ndarray:
        """Source plus target length of each pair."""
        return np.diff(self.src_offsets) + np.diff(self.tgt_offsets)


@dataclass
class PairDataset:
    path: Path
    meta: dict[str, Any]
    vocab: PairVocab
    train: PairSplit
    val: PairSplit
    test: PairSplit

    def split(self, name: str) -> PairSplit:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; use one of {', '.join(SPLITS)}")
        return getattr(self, name)


def _load_split(path: Path, split: str, n: Any, vocab: PairVocab) -> PairSplit:
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"meta.json gives {n!r} {split} pairs")
    with np.load(path / f"{split}.npz", allow_pickle=False) as z:
        if sorted(z.files) != sorted(ARRAYS):
            raise ValueError(f"{split}.npz holds {sorted(z.files)}, not {list(ARRAYS)}")
        got = PairSplit(**{name: z[name] for name in ARRAYS})
    for what, ids, offsets, size in (("source", got.src, got.src_offsets, len(vocab.source)),
                                     ("target", got.tgt, got.tgt_offsets, len(vocab.target))):
        if ids.ndim != 1 or ids.dtype.kind != "u":
            raise ValueError(f"{split}.npz: the {what} ids are not a flat array of unsigned ints")
        if offsets.dtype != np.int64 or offsets.shape != (n + 1,):
            raise ValueError(f"{split}.npz: the {what} offsets do not match the {n} pairs of "
                             "meta.json")
        if offsets[0] != 0 or offsets[-1] != len(ids) or (np.diff(offsets) < 1).any():
            raise ValueError(f"{split}.npz: the {what} offsets do not rise from 0 to {len(ids)}")
        if len(ids) and int(ids.max()) >= size:
            raise ValueError(f"{split}.npz holds {what} ids outside the {size}-unit vocabulary "
                             "of meta.json")
    return got


def load_pairs(path: Path) -> PairDataset:
    """A dataset dir of `prepare_pairs`, checked: any damage is one CharlmError."""
    path = Path(path)
    if not (path / "meta.json").is_file():
        raise CharlmError(f"{path} is not a prepared dataset (no meta.json); give a .tsv file "
                          "of pairs or run `charlm prepare --pairs` first")
    try:
        meta = read_meta(path)
        check_meta_header(meta)
        if meta.get("kind", "text") == "text":  # not caught below: the dataset is fine
            raise CharlmError(f"{path} holds a text dataset, not pairs; give a .tsv file of "
                              "pairs or a dataset dir made by `charlm prepare --pairs`")
        if meta["kind"] != PAIRS_KIND:
            raise ValueError(f"unknown dataset kind {meta['kind']!r}")
        vocab = PairVocab.from_dict(meta["vocab"])
        if meta["target_units"] != vocab.target_units:
            raise ValueError(f"meta.json gives target_units {meta['target_units']!r}, but its "
                             f"vocab {vocab.target_units!r}")
        splits = {split: _load_split(path, split, meta["pairs"][split], vocab)
                  for split in SPLITS}
    except (ValueError, KeyError, TypeError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise CharlmError(f"cannot read dataset {path}: {e}; {AGAIN}") from None
    return PairDataset(path, meta, vocab, **splits)


def path_share(key: str) -> float:
    """Where `key` falls in [0, 1), by its sha256: a file's path under its folder stays on its
    side of data.split files whatever other files come and go (a pair's source likewise)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
