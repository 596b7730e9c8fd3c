"""Paired text for the encoder-decoder (G2P, transliteration, spelling): its vocabulary, reading
"source<TAB>target" lines, the split a pair's source hashes to and a split's ids. Torch-free, so
`charlm prepare --pairs` starts fast."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from charlm.config.data import DataConfig
from charlm.core.errors import CharlmError, characters
from charlm.data.chunks import path_share, read_text
from charlm.data.vocab import check_unknown_policy, id_dtype, list_unknown

if TYPE_CHECKING:  # for annotations only: this module must not load torch
    import torch

SKIP_HINT = "set data.skip_bad_pairs=true to skip such lines"


def target_specials(target_size: int) -> tuple[int, int, int]:
    """The pad, bos and eos ids of a target vocabulary of `target_size` ids: its last three,
    after the units. The one place this layout is written (PairVocab, EncoderDecoder)."""
    return target_size - 3, target_size - 2, target_size - 1


@dataclass(frozen=True)
class PairVocab:
    """Source characters and target units (characters, or space-separated symbols such as
    phonemes). Ids: source characters 0..S-1, then src_pad = S; target units 0..N-1, then pad,
    bos and eos, which never collide with text and are never printed."""

    source: tuple[str, ...]
    target: tuple[str, ...]
    target_units: str = "char"  # "char": one unit per character; "space": space-separated

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", tuple(self.source))  # hashable whatever was given
        object.__setattr__(self, "target", tuple(self.target))
        if self.target_units not in ("char", "space"):
            raise ValueError(f"target_units must be 'char' or 'space', got {self.target_units!r}")
        if not self.source or any(not isinstance(c, str) or len(c) != 1 for c in self.source):
            raise ValueError("the source vocabulary must be a non-empty list of characters")
        # a space unit is one symbol without whitespace: "K AH" must not be a single unit
        unit = (lambda u: len(u) == 1) if self.target_units == "char" else (
            lambda u: u.split() == [u])
        if not self.target or any(not isinstance(u, str) or not unit(u) for u in self.target):
            raise ValueError(f"the target vocabulary must be a non-empty list of "
                             f"{'characters' if self.target_units == 'char' else 'symbols'}")
        for name, units in (("source", self.source), ("target", self.target)):
            if len(set(units)) != len(units):
                raise ValueError(f"the {name} vocabulary must be free of duplicates")

    @classmethod
    def from_pairs(cls, pairs: Sequence[tuple[str, str]], target_units: str) -> PairVocab:
        units = list if target_units == "char" else str.split
        return cls(tuple(sorted({c for s, _ in pairs for c in s})),
                   tuple(sorted({u for _, t in pairs for u in units(t)})), target_units)

    def extended(self, other: PairVocab) -> PairVocab:
        """This vocabulary, then the units of `other` it lacks, sorted: every unit keeps its id."""
        if other.target_units != self.target_units:
            raise CharlmError(f"the data's targets are {other.target_units} units, but the "
                              f"model's are {self.target_units} units; set data.target_units: "
                              f"{self.target_units}")
        return PairVocab(self.source + tuple(sorted(set(other.source) - set(self.source))),
                         self.target + tuple(sorted(set(other.target) - set(self.target))),
                         self.target_units)

    @cached_property
    def _source_index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.source)}

    @cached_property
    def target_index(self) -> dict[str, int]:
        return {u: i for i, u in enumerate(self.target)}

    source_size = property(lambda self: len(self.source) + 1)
    src_pad = property(lambda self: len(self.source))
    target_size = property(lambda self: len(self.target) + 3)
    pad = property(lambda self: target_specials(self.target_size)[0])
    bos = property(lambda self: target_specials(self.target_size)[1])
    eos = property(lambda self: target_specials(self.target_size)[2])

    def encode_source(self, text: str, unknown: str = "error",
                      where: str = "the source") -> list[int]:
        """Ids of `text`; characters outside the vocabulary: an error, or dropped (`skip`)."""
        check_unknown_policy(unknown)
        index = self._source_index
        bad = [(i, c) for i, c in enumerate(text) if c not in index]
        if bad and unknown == "error":
            raise CharlmError(f"{where} has characters outside the model's source vocabulary: "
                              f"{list_unknown(bad, 'at position')}; remove them or pass "
                              "--unknown skip")
        return [index[c] for c in text if c in index]

    def units(self, text: str) -> list[str]:
        return list(text) if self.target_units == "char" else text.split()

    def encode_target(self, text: str) -> list[int]:
        units, index = self.units(text), self.target_index
        bad = [(i, u) for i, u in enumerate(units) if u not in index]
        if bad:
            raise CharlmError(f"the target {text!r} has units outside the target vocabulary: "
                              f"{list_unknown(bad, 'at unit')}; use only the units of the "
                              "training pairs")
        return [index[u] for u in units]

    def decode_source(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        """The source text of `ids`, without padding."""
        return "".join(self.source[i] for i in _int_list(ids) if i != self.src_pad)

    def decode_target(self, ids: Sequence[int] | np.ndarray | torch.Tensor) -> str:
        """The target text of `ids` up to the first eos; pad and bos are not text."""
        units = []
        for i in _int_list(ids):
            if i == self.eos:
                break
            if i in (self.pad, self.bos):
                continue
            if not 0 <= i < len(self.target):
                raise ValueError(f"target id {i} is outside the {self.target_size}-id vocabulary")
            units.append(self.target[i])
        return ("" if self.target_units == "char" else " ").join(units)

    def to_dict(self) -> dict[str, Any]:
        return {"source": list(self.source), "target": list(self.target),
                "target_units": self.target_units}

    @classmethod
    def from_dict(cls, d: Any) -> PairVocab:
        """The vocabulary of `to_dict`'s output; anything else is a ValueError."""
        if not isinstance(d, dict) or set(d) != {"source", "target", "target_units"}:
            raise ValueError("a pair vocabulary must be a mapping of source, target and "
                             "target_units")
        if not isinstance(d["source"], list) or not isinstance(d["target"], list):
            raise ValueError("a pair vocabulary's source and target must be lists")
        return cls(tuple(d["source"]), tuple(d["target"]), d["target_units"])


def _int_list(ids: Sequence[int] | np.ndarray | torch.Tensor) -> list[int]:
    return ids.tolist() if hasattr(ids, "tolist") else [int(i) for i in ids]


@dataclass
class PairSplit:
    """The pairs of one split as four flat arrays (a .npz of a pairs dataset dir): pair i's
    source is src[src_offsets[i]:src_offsets[i + 1]], its target likewise."""

    src: np.ndarray
    src_offsets: np.ndarray
    tgt: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def example(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.src[self.src_offsets[i]:self.src_offsets[i + 1]],
                self.tgt[self.tgt_offsets[i]:self.tgt_offsets[i + 1]])

    @classmethod
    def encode(cls, pairs: Sequence[tuple[str, str]], vocab: PairVocab) -> PairSplit:
        def flat(seqs: list[list[int]], size: int) -> tuple[np.ndarray, np.ndarray]:
            return (np.fromiter(itertools.chain.from_iterable(seqs), dtype=id_dtype(size)),
                    np.cumsum([0, *map(len, seqs)], dtype=np.int64))

        return cls(*flat([vocab.encode_source(s) for s, _ in pairs], vocab.source_size),
                   *flat([vocab.encode_target(t) for _, t in pairs], vocab.target_size))


def references(split: PairSplit, vocab: PairVocab) -> list[tuple[str, list[str]]]:
    """Each distinct source of `split` in first-seen order, with all its distinct targets."""
    grouped: dict[str, list[str]] = {}
    for i in range(len(split)):
        src, tgt = split.example(i)
        refs = grouped.setdefault(vocab.decode_source(src), [])
        target = vocab.decode_target(tgt)
        if target not in refs:
            refs.append(target)
    return list(grouped.items())


def pair_limits(data: DataConfig, block_size: int) -> tuple[int, int]:
    """The longest source (characters) and target (units; its begin id takes a position)."""
    return data.max_source_len or block_size, data.max_target_len or block_size - 1


def pair_settings(data: DataConfig, block_size: int) -> dict[str, Any]:
    """What `prepare_pairs` reads from the config: a cache made with other values is stale."""
    max_source, max_target = pair_limits(data, block_size)
    return {"target_units": data.target_units, "separator": data.separator,
            "val_fraction": data.val_fraction, "test_fraction": data.test_fraction,
            "max_source_len": max_source, "max_target_len": max_target,
            "skip_bad_pairs": data.skip_bad_pairs}


def _pair_form(separator: str) -> str:
    return "source<TAB>target" if separator == "\t" else f"source{separator}target"


def _problem(source: str, found: bool, target: str, data: DataConfig,
             limits: tuple[int, int]) -> str | None:
    """Why a line's pair is bad, or None for a good one."""
    sep = data.separator
    target_len = target.count(" ") + 1 if data.target_units == "space" else len(target)
    one_per_line = f'give one "{_pair_form(sep)}" pair per line, or {SKIP_HINT}'
    if not found:
        name = "tab" if sep == "\t" else repr(sep)
        return f"no {name} separator between source and target; {one_per_line}"
    for what, text in (("source", source), ("target", target)):
        if not text:
            return f"the {what} is empty; {one_per_line}"
    shorten = f"raise it, shorten the line, or {SKIP_HINT}"
    if len(source) > limits[0]:
        which = "data.max_source_len" if data.max_source_len else "model.block_size"
        return (f"the source is {characters(len(source))}, over the limit of {limits[0]} "
                f"({which}); {shorten}")
    if target_len > limits[1]:
        which = "data.max_target_len" if data.max_target_len else "model.block_size - 1"
        unit = "character" if data.target_units == "char" else "symbol"
        return (f"the target is {target_len:,} {unit}s, over the limit of {limits[1]} "
                f"({which}); {shorten}")
    return None


def read_pairs(path: Path, data: DataConfig, block_size: int
               ) -> tuple[list[tuple[str, str]], int]:
    """The (source, target) pairs of a file in order, and the bad lines skipped. Each line splits at
    the first `data.separator`; space-unit targets get single spaces; blank lines are ignored."""
    limits = pair_limits(data, block_size)
    pairs, skipped = [], 0
    for number, line in enumerate(read_text(path).split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        source, found, target = line.partition(data.separator)
        if data.target_units == "space":
            target = " ".join(target.split())
        problem = _problem(source, bool(found), target, data, limits)
        if problem is None:
            pairs.append((source, target))
        elif data.skip_bad_pairs:
            skipped += 1
        else:
            raise CharlmError(f"{path} line {number}: {problem}")
    if not pairs:
        bad = f" ({skipped:,} bad lines skipped)" if skipped else ""
        raise CharlmError(f'{path} holds no pairs{bad}; give one "{_pair_form(data.separator)}"'
                          " pair per line")
    return pairs, skipped


def split_of(source: str, val_fraction: float, test_fraction: float) -> str:
    """"train", "val" or "test" by a hash of `source`: every reference of one source lands in
    the same split, the same on every run and machine."""
    u = path_share(source)  # strict UTF-8 text: its encoding is the surrogateescape one
    return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"
