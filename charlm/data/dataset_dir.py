"""A dataset dir, as `charlm prepare` writes it and every reader opens it: meta.json (its format
and version mark it as charlm's), then train.bin and val.bin (text: ids, read as memmaps) or
train.npz, val.npz and test.npz (pairs: a `PairSplit` each, no pickles), written safely and
loaded back checked. Torch-free, so `charlm prepare` starts fast."""

from __future__ import annotations

import contextlib
import json
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from charlm.core import files
from charlm.core.errors import CharlmError
from charlm.data.pairs import PairSplit, PairVocab
from charlm.data.sources import Source
from charlm.data.vocab import Vocab

DATASET_FORMAT = "charlm-dataset"
DATASET_VERSION = 1
META_HEADER = {"format": DATASET_FORMAT, "version": DATASET_VERSION}  # what marks one charlm's
PAIRS_KIND = "pairs"

SPLITS = ("train", "val", "test")
DATASET_FILES = ("meta.json", "train.bin", "val.bin", "test.bin")  # test: a benchmark's
PAIR_FILES = ("meta.json", *(f"{split}.npz" for split in SPLITS))
ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets")

# meta.json (and an export's vocab.json) hold a vocabulary: even every Unicode character, one a
# line, stays below this; a file far larger is not charlm's and would fill the memory
META_LIMIT = 16 << 20


def read_meta(path: Path) -> Any:
    """The parsed meta.json of the directory `path`, whatever JSON it holds. Raises OSError
    (FileNotFoundError when there is none) or ValueError (not JSON, not UTF-8)."""
    return json.loads(files.read_regular(path / "meta.json", "dataset metadata", META_LIMIT)
                      .decode("utf-8"))


def checked_meta(path: Path) -> dict[str, Any]:
    """`read_meta`, and a ValueError unless it is a charlm dataset's, of the version read here."""
    meta = read_meta(path)
    if not isinstance(meta, dict) or meta.get("format") != DATASET_FORMAT:
        raise ValueError("not a charlm dataset")
    if meta.get("version") != DATASET_VERSION:
        raise ValueError(f"dataset format version {meta.get('version')}")
    return meta


def dataset_meta(path: Path) -> dict[str, Any] | None:
    """The meta.json of the directory `path` if it is a charlm dataset's, else None."""
    try:
        meta = read_meta(path)
    except (ValueError, OSError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == DATASET_FORMAT else None


def replaceable(out: Path, names: Sequence[str] = DATASET_FILES) -> bool:
    """Whether `prepare` may write into the existing directory `out`: one that holds a charlm
    dataset, or nothing but `names` and hidden temporaries with meta.json missing, or damaged
    beside data files (a prepare or a machine stopped before writing meta.json)."""
    if dataset_meta(out) is not None:
        return True
    if not all(p.name.startswith(".") or p.name in names for p in out.iterdir()):
        return False
    try:
        read_meta(out)
    except FileNotFoundError:
        return True
    except (ValueError, OSError):  # damaged (cut short by a crash)
        return any((out / name).exists() for name in names[1:])
    return False


def dataset_lock(out: Path) -> contextlib.AbstractContextManager[None]:
    """The lock a prepare holds on its dataset dir, so that two never mix their files."""
    return files.locked_dir(out, f"dataset dir {out} is in use by another `charlm prepare` (or "
                            "a `charlm train` preparing its data); wait for it to end, or "
                            "choose another --out")


def check_out(out: Path, names: Sequence[str] = DATASET_FILES) -> None:
    """An --out that may be written: new, or a directory `replaceable` by a dataset of `names`."""
    if out.exists() and not out.is_dir():
        raise CharlmError(f"--out must be a directory, but {out} is a file")
    if out.is_dir() and not (replaceable(out) or replaceable(out, names)):
        raise CharlmError(f"--out {out} is not empty and holds no charlm dataset; give a new or "
                          "empty directory, or a dataset dir to replace")


def write_dataset(out: Path, finals: Sequence[Path], write: Callable[[list[BinaryIO]], Any],
                  meta: dict[str, Any], stale: Sequence[str] = ()) -> None:
    """`write` the files `finals` of the dataset dir `out` (`write_files_atomic`), the old
    meta.json gone before they move (so no reader takes old and new files for one dataset), then
    `meta`, and remove `stale`."""
    files.make_writable_dir(out, f"dataset dir {out}")
    for name in DATASET_FILES + PAIR_FILES[1:]:  # the temporaries a killed process left
        files.remove_temps(out / name, only_dead=True)
    meta_path = out / "meta.json"
    files.write_files_atomic(finals, write, before_move=lambda: meta_path.unlink(missing_ok=True))
    files.write_text_atomic(meta_path, json.dumps(meta, ensure_ascii=False, indent=1))
    for name in stale:
        (out / name).unlink(missing_ok=True)


def text_meta(vocab: Vocab, val_fraction: float, settings: dict[str, Any],
              tokens: dict[str, int], **more: Any) -> dict[str, Any]:
    """A text dataset's meta.json, `tokens` ids in each split, in the order prepare writes."""
    return {**META_HEADER, "vocab": vocab.chars, "vocab_size": len(vocab),
            "dtype": vocab.dtype.name, "val_fraction": val_fraction, **settings,
            **{f"{split}_tokens": n for split, n in tokens.items()}, **more}


def source_entry(source: Source, size: int, sha256: str, **more: Any) -> dict[str, Any]:
    """A source as meta.json lists it: the key of a cache (`same_sources`), then `more`."""
    return {"path": source.name, "bytes": size, "sha256": sha256, **more}


def is_dataset_dir(path: Path) -> bool:
    """Whether `path` is a prepared dataset dir (one with a meta.json), not a folder of text."""
    return path.is_dir() and (path / "meta.json").exists()


@dataclass
class Dataset:
    """A prepared text dataset: its vocabulary and its splits as read-only memmaps (a test split
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
        raise CharlmError(f"{path} is not a prepared dataset (no meta.json); give a text file "
                          "or run `charlm prepare` first")
    try:
        meta = checked_meta(path)
        vocab = Vocab(meta["vocab"], meta.get("units", "char"), meta.get("unicode_normalize"))
        # the declared sizes must be the vocabulary's: a hand-edited one is not silently ignored
        if meta["vocab_size"] != len(vocab):
            raise ValueError(f"meta.json gives vocab_size {meta['vocab_size']!r}, but its vocab "
                             f"holds {len(vocab)} characters")
        if meta["dtype"] != vocab.dtype.name:
            raise ValueError(f"meta.json gives dtype {meta['dtype']!r}, but a {len(vocab)}-symbol "
                             f"vocabulary has {vocab.dtype.name} ids")
        splits = {}
        for split in SPLITS[:3 if "test_tokens" in meta else 2]:
            n = meta[f"{split}_tokens"]
            bin_path = path / f"{split}.bin"
            if bin_path.stat().st_size != n * vocab.dtype.itemsize:
                raise ValueError(f"{split}.bin does not match meta.json")
            splits[split] = (np.memmap(bin_path, dtype=vocab.dtype, mode="r") if n else
                             np.zeros(0, dtype=vocab.dtype))
            if n and int(splits[split].max()) >= len(vocab):  # one vectorised pass
                raise ValueError(f"{split}.bin holds ids outside the {len(vocab)}-symbol "
                                 "vocabulary of meta.json")
    except (ValueError, KeyError, TypeError, OSError, CharlmError) as e:
        raise CharlmError(
            f"cannot read dataset {path}: {e}; prepare it again with `charlm prepare`"
        ) from None
    return Dataset(path, meta, vocab, splits["train"], splits["val"], splits.get("test"))


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
        meta = checked_meta(path)
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
        raise CharlmError(f"cannot read dataset {path}: {e}; prepare it again with `charlm "
                          "prepare --pairs`") from None
    return PairDataset(path, meta, vocab, **splits)
