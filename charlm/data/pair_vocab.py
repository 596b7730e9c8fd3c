"""The encoder-decoder's vocabulary: `PairVocab`, its source characters and target units
(characters, or space-separated symbols such as phonemes) with special ids, and
`target_specials`, the one place the layout of those ids is written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from charlm.core.errors import CharlmError, Setting, SettingError
from charlm.data.vocab import list_unknown

if TYPE_CHECKING:  # `charlm prepare --pairs` imports this module and must not pay for torch
    import torch


def target_specials(target_size: int) -> tuple[int, int, int]:
    """The pad, bos and eos ids of a target vocabulary of `target_size` ids: its last three,
    after the units. The one place this layout is written (PairVocab, EncoderDecoder)."""
    return target_size - 3, target_size - 2, target_size - 1


@dataclass(frozen=True)
class PairVocab:
    """Source characters and target units, each free of duplicates (sorted, or a parent's order
    then the new ones: `extended`). Ids: source characters 0..S-1, then
    src_pad = S; target units 0..N-1, then pad, bos and eos (after the units, so they never
    collide with text and are never printed)."""

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
        source = set("".join(s for s, _ in pairs))
        targets = (t for _, t in pairs)
        target = set("".join(targets)) if target_units == "char" else set(
            " ".join(targets).split())
        return cls(tuple(sorted(source)), tuple(sorted(target)), target_units)

    def extended(self, other: PairVocab) -> PairVocab:
        """This vocabulary, then the source characters and target units of `other` it lacks,
        sorted: every unit keeps its id, and the special ids follow the new units."""
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

    @property
    def source_size(self) -> int:
        return len(self.source) + 1

    @property
    def target_size(self) -> int:
        return len(self.target) + 3

    @property
    def src_pad(self) -> int:
        return len(self.source)

    @property
    def pad(self) -> int:
        return target_specials(self.target_size)[0]

    @property
    def bos(self) -> int:
        return target_specials(self.target_size)[1]

    @property
    def eos(self) -> int:
        return target_specials(self.target_size)[2]

    def encode_source(self, text: str, unknown: str = "error",
                      where: str = "the source") -> list[int]:
        """Ids of `text`; characters outside the vocabulary are an error, or dropped with
        unknown='skip'."""
        if unknown not in ("error", "skip"):
            raise SettingError(Setting("unknown"), f" must be 'error' or 'skip', got {unknown!r}")
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
