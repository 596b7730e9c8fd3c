"""`Vocab`: the character vocabulary, a sorted list of Unicode code points, stored as JSON."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from charlm.errors import CharlmError

MAX_CODE_POINT = 0x110000


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds every id of a vocabulary this size."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise CharlmError(f"vocabulary of {vocab_size} symbols is too large")


def code_points(text: str) -> np.ndarray:
    """The code points of `text` as a uint32 array, without a Python loop over characters."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def list_unknown(bad: Sequence[tuple[int, str]], at: str = "at", limit: int = 10) -> str:
    """The first `limit` of `Vocab.unknown`'s (position, character) pairs as text for a message,
    then how many more: a long text in another script must not make an endless error line."""
    listed = ", ".join(f"{c!r} {at} {i}" for i, c in bad[:limit])
    return listed + (f" and {len(bad) - limit} more" if len(bad) > limit else "")


class Vocab:
    """Maps characters to ids 0..V-1 in code point order, and back."""

    def __init__(self, chars: Sequence[str]):
        chars = list(chars)
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise CharlmError("a vocabulary must be a list of single characters")
        if not chars:  # a model with no symbols cannot be built (torch warns, then fails)
            raise CharlmError("a vocabulary must hold at least one character")
        if chars != sorted(set(chars)):
            raise CharlmError("a vocabulary must be sorted and free of duplicates")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}
        self.dtype = id_dtype(len(chars))
        # Code point -> id lookup table for vectorised encoding; -1 marks unknown characters.
        self._code_points = code_points("".join(chars))
        self._lut = np.full(MAX_CODE_POINT, -1, dtype=np.int32)
        self._lut[self._code_points] = np.arange(len(chars))

    def __len__(self) -> int:
        return len(self.chars)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.chars == other.chars

    @classmethod
    def from_code_points(cls, cps: np.ndarray) -> Vocab:
        return cls("".join(map(chr, np.sort(cps))))

    def unknown(self, text: str) -> list[tuple[int, str]]:
        """(position, character) of each character of `text` outside the vocabulary."""
        ids = self._lut[code_points(text)]
        return [(int(i), text[i]) for i in np.flatnonzero(ids < 0)]

    def encode_array(self, text: str) -> np.ndarray:
        """Ids of `text` as an array of `self.dtype`; unknown characters are an error."""
        ids = self._lut[code_points(text)]
        if (ids < 0).any():
            listed = list_unknown(self.unknown(text))
            raise CharlmError(f"characters outside the vocabulary: {listed}")
        return ids.astype(self.dtype)

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).astype(np.int64).tolist()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        # Through code points, not a numpy string array: that would drop U+0000 (NUL), which
        # numpy takes for padding.
        cps = self._code_points[np.asarray(ids, dtype=np.int64)]
        return cps.tobytes().decode("utf-32-le", "surrogatepass")
