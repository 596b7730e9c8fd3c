"""A prepared pairs dataset: `load_pairs` opens its three splits (one .npz each) after checking
them, `pairs_for` prepares a .tsv into a cache dir, and `references` groups a split's targets
by source."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from charlm.config.data import DataConfig
from charlm.core.errors import CharlmError
from charlm.data.dataset import check_meta_header
from charlm.data.digest import sha256_file
from charlm.data.pair_vocab import PairVocab
from charlm.data.pairs import (
    AGAIN,
    ARRAYS,
    PAIR_FILES,
    PAIRS_KIND,
    SPLITS,
    pair_settings,
    prepare_pairs,
)
from charlm.data.text import (
    check_source_file,
    dataset_meta,
    read_meta,
    remove_killed_temps,
)


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


def pairs_for(data: DataConfig, block_size: int, cache_dir: Path,
              check: Callable[[PairVocab], None] | None = None,
              base: PairVocab | None = None) -> PairDataset:
    """The pairs of `data.path`: a prepared directory as is, or a pairs file prepared into
    `cache_dir` (reused while the file's sha256, every preparing setting and the `base` are
    unchanged). Before a cache is rebuilt, `check` sees the new vocabulary and may raise: pairs
    it rejects (say, other data for a resumed run) leave the existing cache alone. With a `base`
    (a fine-tuned model's vocabulary) its ids come first (`PairVocab.extended`); a prepared
    directory must already number them so."""
    path = Path(data.path)
    if path.is_dir():
        dataset = load_pairs(path)
        if base is not None and dataset.vocab != base.extended(dataset.vocab):
            raise CharlmError(
                f"dataset {path} numbers its units in its own order, but a fine-tuned model "
                "keeps its parent's ids; give the pairs file it was prepared from as the data, "
                "which charlm train then prepares with the parent's vocabulary")
        return dataset
    check_source_file(path)
    meta = dataset_meta(cache_dir)
    if meta is not None and meta.get("kind") == PAIRS_KIND:
        try:
            settings = pair_settings(data, block_size)
            # made with this base (or none), or numbered as the base itself: a resume's
            same_base = (meta.get("base") is None if base is None else
                         base.to_dict() in (meta.get("base"), meta["vocab"]))
            if ([s["sha256"] for s in meta["sources"]] == [sha256_file(path)] and same_base
                    and all(meta.get(key) == value for key, value in settings.items())):
                remove_killed_temps(cache_dir, PAIR_FILES)  # no prepare will, while reused
                return load_pairs(cache_dir)
        except (KeyError, TypeError, CharlmError):
            pass  # a damaged cache is rebuilt
    prepare_pairs([path], cache_dir, data, block_size, check, base)
    return load_pairs(cache_dir)


def references(split: PairSplit, vocab: PairVocab) -> list[tuple[str, list[str]]]:
    """Each distinct source of `split` in first-seen order, with all its distinct targets: the
    references of multi-reference accuracy."""
    grouped: dict[str, list[str]] = {}
    for i in range(len(split)):
        src, tgt = split.example(i)
        refs = grouped.setdefault(vocab.decode_source(src), [])
        target = vocab.decode_target(tgt)
        if target not in refs:
            refs.append(target)
    return list(grouped.items())
