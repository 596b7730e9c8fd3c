"""The text vocabulary `Vocab`, of characters (`char` units) or of the bytes of the text's UTF-8
(`byte`), stored as characters too (byte value b as code point b), so the character machinery
runs unchanged over raw bytes and any file in any script is representable; and `TextStream`,
the one way ids become text as they are generated."""

from __future__ import annotations

import codecs
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from charlm.core.errors import CharlmError, Setting, SettingError


def unit_name(units: str) -> str:
    """What one id is, in messages: "character" or "byte"."""
    return "character" if units == "char" else "byte"


class TextStream:
    """Ids to text as they are generated: `feed(id)` gives the text that id completes, in byte
    units once a character's last byte arrives. Bytes that are not UTF-8 raise
    UnicodeDecodeError: the sampler's mask (`charlm.generation.utf8`) never draws them."""

    def __init__(self, chars: Sequence[str], units: str):
        self.chars = chars
        self.decoder = (codecs.getincrementaldecoder("utf-8")("strict") if units == "byte"
                        else None)

    def feed(self, token: int) -> str:
        c = self.chars[token]
        return c if self.decoder is None else self.decoder.decode(c.encode("latin-1"))


MAX_CODE_POINT = 0x110000

GATHER_SLICE = 1 << 16


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds every id of a vocabulary this size."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise CharlmError(f"vocabulary of {vocab_size} symbols is too large")


def gather(table: np.ndarray, cps: np.ndarray) -> np.ndarray:
    """`table[cps]`, in slices: np.take makes an intp copy of its indices, which for a slice
    stays in the cache (and costs less memory than one of a whole chunk)."""
    out = np.empty(len(cps), dtype=table.dtype)
    for i in range(0, len(cps), GATHER_SLICE):
        np.take(table, cps[i:i + GATHER_SLICE], out=out[i:i + GATHER_SLICE])
    return out


def code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


UNKNOWN_LISTED = 10  # characters a message lists


def list_unknown(bad: Sequence[tuple[int, str]], at: str = "at", total: int | None = None) -> str:
    """The first (position, character) pairs of `bad` for a message, then how many more (of
    `total`, when `bad` holds only the first): a text in another script makes no endless line."""
    total = len(bad) if total is None else total
    listed = ", ".join(f"{c!r} {at} {i}" for i, c in bad[:UNKNOWN_LISTED])
    return listed + (f" and {total - UNKNOWN_LISTED} more" if total > UNKNOWN_LISTED else "")


def check_unknown_policy(unknown: str) -> None:
    """What to do with characters outside a vocabulary: `--unknown` error or skip."""
    if unknown not in ("error", "skip"):
        raise SettingError(Setting("unknown"), f" must be 'error' or 'skip', got {unknown!r}")


class Vocab:
    """Maps characters (or bytes) to ids 0..V-1 in the order of `chars`, and back: a text's own
    in code point order, a fine-tune's in its parent's order then the new characters. One with
    a Unicode normal form puts every text it is given in it first, as its data was."""

    def __init__(self, chars: Sequence[str], units: str = "char", normalize: str | None = None):
        chars = list(chars)
        if normalize not in (None, "NFC", "NFKC", "NFD", "NFKD"):
            raise CharlmError(f"a vocabulary's normal form must be one of NFC, NFKC, NFD, NFKD, "
                              f"got {normalize!r}")
        if units not in ("char", "byte"):
            raise CharlmError(f"a vocabulary's units must be 'char' or 'byte', got {units!r}")
        if units == "byte" and any(not isinstance(c, str) or c > "\xff" for c in chars):
            raise CharlmError("a byte vocabulary must hold characters U+0000..U+00FF, one a "
                              "byte value")
        if any(not isinstance(c, str) or len(c) != 1 for c in chars):
            raise CharlmError("a vocabulary must be a list of single characters")
        if not chars:  # a model with no symbols cannot be built (torch warns, then fails)
            raise CharlmError("a vocabulary must hold at least one character")
        if len(set(chars)) != len(chars):
            raise CharlmError("a vocabulary must be free of duplicates")
        if any("\ud800" <= c <= "\udfff" for c in chars):  # no UTF-8 text has one; printing fails
            raise CharlmError("a vocabulary must not hold a surrogate (U+D800..U+DFFF)")
        self.chars = chars
        self.units = units
        self.normalize = normalize  # the Unicode normal form of its texts, None: as written
        self.index = {c: i for i, c in enumerate(chars)}
        self.dtype = id_dtype(len(chars))
        # Code point -> id table; the id len(chars) marks a character outside the vocabulary, so
        # up to 255 characters it is uint8, and its first 256 entries serve `bytes.translate`.
        self._code_points = code_points("".join(chars))
        self._table = np.full(MAX_CODE_POINT, len(chars), dtype=id_dtype(len(chars) + 1))
        self._table[self._code_points] = np.arange(len(chars))
        self._byte_table = (self._table[:256].tobytes() if self._table.dtype == np.uint8
                            else None)

    def __len__(self) -> int:
        return len(self.chars)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Vocab) and self.chars == other.chars
                and self.units == other.units and self.normalize == other.normalize)

    def state(self) -> list[str] | dict[str, Any]:
        """The vocabulary as a checkpoint or an export stores it: a plain character vocabulary
        as its list, else {"units", "chars"} and "normalize" when its texts have a normal form."""
        if self.units == "char" and self.normalize is None:
            return self.chars
        return {"units": self.units, "chars": self.chars,
                **({} if self.normalize is None else {"normalize": self.normalize})}

    @classmethod
    def from_state(cls, state: Any) -> Vocab:
        if isinstance(state, dict):
            if not {"units", "chars"} <= set(state) <= {"units", "chars", "normalize"}:
                raise ValueError("a vocabulary must be a list of characters, or a mapping of "
                                 "units, chars and normalize")
            return cls(state["chars"], state["units"], state.get("normalize"))
        return cls(state)

    def normalized(self, text: str) -> str:
        """`text` (a prompt, an eval text) in the vocabulary's normal form."""
        return text if self.normalize is None else unicodedata.normalize(self.normalize, text)

    def stream(self) -> TextStream:
        return TextStream(self.chars, self.units)

    def extended(self, chars: Sequence[str]) -> Vocab:
        """This vocabulary, then the new characters of `chars` in code point order (ids kept)."""
        return Vocab(self.chars + sorted(set(chars) - set(self.chars)), self.units,
                     self.normalize)

    def unknown(self, text: str) -> list[tuple[int, str]]:
        """(position, character) of each character of `text` that `encode_known` drops."""
        return [(int(i), text[i]) for i in self.encode_known(code_points(text))[1]]

    def tail(self, text: str, n: int) -> str:
        """The longest tail of `text` that encodes to at most `n` ids (in byte units a cut
        inside a character drops its remaining bytes)."""
        if self.units == "char":
            return text[max(len(text) - n, 0):]
        return text.encode("utf-8")[-n:].decode("utf-8", "ignore") if n > 0 else ""

    def _outside(self, c: str) -> bool:
        """Whether a byte of the UTF-8 of the character `c` is outside this byte vocabulary (a
        lone surrogate, which has no UTF-8, is)."""
        try:
            return self._table[list(c.encode("utf-8"))].max() == len(self)
        except UnicodeEncodeError:
            return True

    def encode_array(self, text: str) -> np.ndarray:
        """Ids of `text` as an array of `self.dtype`; unknown characters are an error."""
        ids = self.encode_code_points(text.encode("utf-8") if self.units == "byte" else
                                      code_points(text))
        return np.frombuffer(ids, dtype=self.dtype) if isinstance(ids, bytes) else ids

    def encode_code_points(self, cps: bytes | np.ndarray) -> bytes | np.ndarray:
        """Ids of the characters with code points `cps`; unknown characters are an error. Code
        points given as bytes come back as bytes of ids when every id fits in a byte, mapped by
        `bytes.translate` (faster than a numpy gather), else as an array of `self.dtype`."""
        if isinstance(cps, bytes):
            if self._byte_table is not None:
                ids = cps.translate(self._byte_table)
                if len(self) not in ids:  # a memchr for the mark of an unknown character
                    return ids
            cps = np.frombuffer(cps, dtype=np.uint8)
        ids = gather(self._table, cps)
        if len(ids) and ids.max() == len(self):  # the mark: the one value above every id
            bad = [(int(i), chr(int(cps[i]))) for i in np.flatnonzero(ids == len(self))]
            raise CharlmError(f"characters outside the vocabulary: {list_unknown(bad)}")
        return ids.astype(self.dtype, copy=False)

    def encode_known(self, cps: bytes | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids of the text of code points `cps` less its characters outside the vocabulary,
        and their positions in `cps` (in byte units: those with a byte of their UTF-8 outside)."""
        if isinstance(cps, bytes):
            cps = np.frombuffer(cps, dtype=np.uint8)
        if self.units == "char":
            ids = gather(self._table, cps)
            bad = np.flatnonzero(ids == len(self))
            return np.delete(ids, bad).astype(self.dtype, copy=False), bad
        # by the distinct characters, so a chunk costs one pass whatever its script
        distinct = np.flatnonzero(np.bincount(cps)).tolist()
        out = [c for c in distinct if self._outside(chr(c))]
        bad = np.flatnonzero(np.isin(cps, out)) if out else np.zeros(0, dtype=np.intp)
        kept = np.delete(cps, bad).astype(np.uint32)  # no surrogate is kept: UTF-8 has none
        text = kept.tobytes().decode("utf-32-le").encode("utf-8")
        ids = gather(self._table, np.frombuffer(text, dtype=np.uint8))
        return ids.astype(self.dtype, copy=False), bad

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).astype(np.int64).tolist()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`; in byte units their bytes decoded strictly as UTF-8."""
        # through code points, not a numpy string array, which takes U+0000 for padding
        cps = self._code_points[np.asarray(ids, dtype=np.int64)]
        if self.units == "byte":
            return cps.astype(np.uint8).tobytes().decode("utf-8")
        return cps.tobytes().decode("utf-32-le", "surrogatepass")
