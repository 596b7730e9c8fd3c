"""A prepared text dataset: `load_dataset` opens a dataset dir (meta.json, train.bin, val.bin as
memmaps) after checking it, and `dataset_for` prepares a text file into a cache dir, reused
while the source's sha256 and the val fraction match."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from charlm.core.errors import CharlmError, characters
from charlm.data.digest import sha256_file
from charlm.data.text import (
    DATASET_FILES,
    DATASET_FORMAT,
    DATASET_VERSION,
    check_source_file,
    dataset_meta,
    prepare,
    read_meta,
    remove_killed_temps,
    scan,
)
from charlm.data.vocab import Vocab


@dataclass
class Dataset:
    """A prepared dataset: its vocabulary and the two splits as read-only memmaps."""

    path: Path
    meta: dict[str, Any]
    vocab: Vocab
    train: np.ndarray
    val: np.ndarray

    def split(self, name: str) -> np.ndarray:
        return self.train if name == "train" else self.val


def check_meta_header(meta: Any) -> None:
    """Raise ValueError unless a dataset's meta.json is charlm's, of the version read here."""
    if not isinstance(meta, dict) or meta.get("format") != DATASET_FORMAT:
        raise ValueError("not a charlm dataset")
    if meta.get("version") != DATASET_VERSION:
        raise ValueError(f"dataset format version {meta.get('version')}")


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
        vocab = Vocab(meta["vocab"])
        # The declared sizes must be the vocabulary's: a hand-edited one is not silently ignored.
        if meta["vocab_size"] != len(vocab):
            raise ValueError(f"meta.json gives vocab_size {meta['vocab_size']!r}, but its vocab "
                             f"holds {len(vocab)} characters")
        if meta["dtype"] != vocab.dtype.name:
            raise ValueError(f"meta.json gives dtype {meta['dtype']!r}, but a {len(vocab)}-symbol "
                             f"vocabulary has {vocab.dtype.name} ids")
        splits = {}
        for split in ("train", "val"):
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
    return Dataset(path, meta, vocab, splits["train"], splits["val"])


def dataset_for(data_path: str | Path, val_fraction: float, cache_dir: Path,
                check: Callable[[Vocab], None] | None = None) -> Dataset:
    """The dataset for `data.path`: a prepared directory as is, or a text file prepared into
    `cache_dir` (reused while the file's sha256 and the val fraction are unchanged). Before a
    cache is rebuilt, `check` sees the text's vocabulary and may raise: a text it rejects (say,
    other data for a resumed run) leaves the existing cache alone."""
    data_path = Path(data_path)
    if data_path.is_dir():
        return load_dataset(data_path)
    check_source_file(data_path)
    meta = dataset_meta(cache_dir)
    if meta is not None:
        try:
            cached = [s["sha256"] for s in meta["sources"]]
            if cached == [sha256_file(data_path)] and meta["val_fraction"] == val_fraction:
                remove_killed_temps(cache_dir, DATASET_FILES)  # no prepare will, while reused
                return load_dataset(cache_dir)
        except (KeyError, TypeError, CharlmError):
            pass  # a damaged cache (a truncated train.bin, say) is rebuilt
    if check is not None:
        check(scan([data_path])[1])
    prepare([data_path], cache_dir, val_fraction)
    return load_dataset(cache_dir)


def require_window(data: np.ndarray, block_size: int, split: str,
                   source: str | Path | None = None) -> None:
    """A split must hold at least one window of block_size + 1 characters."""
    if len(data) < block_size + 1:
        of = f" of {source}" if source is not None else ""
        # A prepared dataset dir has its split fixed: data.val_fraction does not apply to it.
        prepared = source is not None and Path(source).is_dir()
        more_val = (" or prepare it again with a larger --val-fraction" if prepared else
                    " or raise data.val_fraction")
        raise CharlmError(
            f"the {split} split{of} is too short: {characters(len(data))}, but one window needs "
            f"block_size + 1 = {block_size + 1}; give more text, or lower model.block_size"
            + (more_val if split == "val" else "")
        )
