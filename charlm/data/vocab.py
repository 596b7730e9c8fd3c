"""What one id is, and the vocabularies that map text to ids.

Units: characters (`char`) or the bytes of the text's UTF-8 (`byte`). A byte vocabulary is
stored as characters too: byte value b is the character with code point b (Latin-1), so the
character machinery runs unchanged over raw bytes and any file in any script is representable.
`TextStream` is the one way ids become text as they are generated, a character at a time.

`Vocab`: a list of distinct characters (in code point order, or a parent model's order followed
by a fine-tune's new characters), stored as JSON, with `CharacterSet`, the characters of a text
met chunk by chunk that make one; one with a Unicode normal form puts every text it is given in
it first (`normalized`), as its data was. `PairVocab`: an encoder-decoder's source characters
and target units (characters, or space-separated symbols such as phonemes) with special ids."""

from __future__ import annotations

import codecs
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from charlm.core.errors import CharlmError, Setting, SettingError

if TYPE_CHECKING:  # `charlm prepare` imports this module and must not pay for importing torch
    import torch

UNITS = ("char", "byte")


def unit_name(units: str) -> str:
    """What one id is, in messages: "character" or "byte"."""
    return "character" if units == "char" else "byte"


def utf8(c: str) -> bytes | None:
    """The UTF-8 bytes of the character `c`, None for a lone surrogate (no UTF-8 text has one)."""
    try:
        return c.encode("utf-8")
    except UnicodeEncodeError:
        return None


def unknown_in_bytes(text: str, known: Callable[[bytes], bool]) -> list[tuple[int, str]]:
    """(position, character) of each character of `text` whose UTF-8 bytes are not all `known`
    (a byte vocabulary's check), by its distinct characters, so a long text costs one pass."""
    bad = {c for c in set(text) if (b := utf8(c)) is None or not known(b)}
    return [(i, c) for i, c in enumerate(text) if c in bad] if bad else []


def byte_tail(text: str, n: int) -> str:
    """The longest tail of `text` whose UTF-8 is at most `n` bytes: the cut may fall inside a
    character, whose remaining continuation bytes are dropped."""
    return text.encode("utf-8")[-n:].decode("utf-8", "ignore") if n > 0 else ""


class TextStream:
    """Ids to text as they are generated: `feed(id)` gives the text that id completes. In
    character units that is the id's character; in byte units the bytes of a character are
    held until its last one arrives, so a partial character is never shown (a sequence cut
    short leaves its last, unfinished character unsaid). Bytes that are not UTF-8 raise
    UnicodeDecodeError: the sampler's mask (`charlm.generation.utf8`) never draws them."""

    def __init__(self, chars: Sequence[str], units: str):
        self.chars = chars
        self.decoder = (codecs.getincrementaldecoder("utf-8")("strict") if units == "byte"
                        else None)

    def feed(self, token: int) -> str:
        c = self.chars[token]
        return c if self.decoder is None else self.decoder.decode(c.encode("latin-1"))

    def pending(self) -> bool:
        """Whether bytes of an unfinished character are held."""
        return self.decoder is not None and bool(self.decoder.getstate()[0])


MAX_CODE_POINT = 0x110000

NORMAL_FORMS = (None, "NFC", "NFKC", "NFD", "NFKD")

GATHER_SLICE = 1 << 16


def id_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds every id of a vocabulary this size."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise CharlmError(f"vocabulary of {vocab_size} symbols is too large")


def gather(table: np.ndarray, cps: np.ndarray) -> np.ndarray:
    """`table[cps]`, in slices: np.take makes an intp copy of its indices, which for a slice of
    64K code points stays in the cache (twice as fast as one take of a whole chunk, and eight
    bytes a code point less memory)."""
    out = np.empty(len(cps), dtype=table.dtype)
    for i in range(0, len(cps), GATHER_SLICE):
        np.take(table, cps[i:i + GATHER_SLICE], out=out[i:i + GATHER_SLICE])
    return out


def code_points(text: str) -> np.ndarray:
    """The code points of `text` as a uint32 array, without a Python loop over characters."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


UNKNOWN_LISTED = 10  # characters a message lists


def list_unknown(bad: Sequence[tuple[int, str]], at: str = "at", limit: int = UNKNOWN_LISTED,
                 total: int | None = None) -> str:
    """The first `limit` of `Vocab.unknown`'s (position, character) pairs as text for a message,
    then how many more (of `total`, when `bad` holds only the first): a long text in another
    script must not make an endless error line."""
    total = len(bad) if total is None else total
    listed = ", ".join(f"{c!r} {at} {i}" for i, c in bad[:limit])
    return listed + (f" and {total - limit} more" if total > limit else "")


class Vocab:
    """Maps characters (in byte units: the bytes of a text's UTF-8) to ids 0..V-1 in the order
    of `chars`, and back. A text's own vocabulary is in code point order; a fine-tune's keeps
    its parent's order and adds the new characters after it (`extended`)."""

    def __init__(self, chars: Sequence[str], units: str = "char", normalize: str | None = None):
        chars = list(chars)
        if normalize not in NORMAL_FORMS:
            raise CharlmError(f"a vocabulary's normal form must be one of NFC, NFKC, NFD, NFKD, "
                              f"got {normalize!r}")
        if units not in UNITS:
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
        # Code point -> id lookup table for vectorised encoding. The id len(chars) marks a
        # character outside the vocabulary, so the table is uint8 up to 255 characters; then its
        # first 256 entries also serve `bytes.translate` for code points given as bytes.
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

    @classmethod
    def from_code_points(cls, cps: np.ndarray, units: str = "char") -> Vocab:
        return cls("".join(map(chr, np.sort(cps))), units)

    def state(self) -> list[str] | dict[str, Any]:
        """The vocabulary as a checkpoint or an export stores it: a character vocabulary as
        its list (as before byte units existed), else {"units", "chars"} and "normalize" when
        its texts have a normal form."""
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
        """`text` in the vocabulary's normal form (a prompt, an eval text), as its data was."""
        return text if self.normalize is None else unicodedata.normalize(self.normalize, text)

    def stream(self) -> TextStream:
        """A `TextStream` of this vocabulary: ids to text, a finished character at a time."""
        return TextStream(self.chars, self.units)

    def extended(self, chars: Sequence[str]) -> Vocab:
        """This vocabulary, then the characters of `chars` it lacks in code point order: every
        character keeps its id (a fine-tune's vocabulary, the parent's first)."""
        return Vocab(self.chars + sorted(set(chars) - set(self.chars)), self.units,
                     self.normalize)

    def unknown(self, text: str) -> list[tuple[int, str]]:
        """(position, character) of each character of `text` outside the vocabulary (in byte
        units: a character with a byte of its UTF-8 outside it)."""
        if self.units == "byte":
            return unknown_in_bytes(text, lambda b: self._table[list(b)].max() < len(self))
        return self._unknown(code_points(text))

    def tail(self, text: str, n: int) -> str:
        """The longest tail of `text` that encodes to at most `n` ids."""
        return byte_tail(text, n) if self.units == "byte" else text[max(len(text) - n, 0):]

    def _unknown(self, cps: np.ndarray) -> list[tuple[int, str]]:
        ids = gather(self._table, cps)
        return [(int(i), chr(int(cps[i]))) for i in np.flatnonzero(ids == len(self))]

    def encode_array(self, text: str) -> np.ndarray:
        """Ids of `text` as an array of `self.dtype`; unknown characters are an error."""
        if self.units == "byte":
            ids = self.encode_code_points(text.encode("utf-8"))
            return np.frombuffer(ids, dtype=self.dtype) if isinstance(ids, bytes) else ids
        return self.encode_code_points(code_points(text))

    def encode_code_points(self, cps: bytes | np.ndarray) -> bytes | np.ndarray:
        """Ids of the characters with code points `cps`; unknown characters are an error.

        Code points given as bytes (each below 256: ASCII or Latin-1 text) come back as bytes
        of ids when every id fits in a byte, mapped by `bytes.translate`, many times faster than
        a numpy gather; anything else comes back as an array of `self.dtype`.
        """
        if isinstance(cps, bytes):
            if self._byte_table is not None:
                ids = cps.translate(self._byte_table)
                if len(self) not in ids:  # a memchr for the mark of an unknown character
                    return ids
            cps = np.frombuffer(cps, dtype=np.uint8)
        ids = gather(self._table, cps)
        if len(ids) and ids.max() == len(self):  # the mark: the one value above every id
            raise CharlmError(f"characters outside the vocabulary: "
                              f"{list_unknown(self._unknown(cps))}")
        return ids.astype(self.dtype, copy=False)

    def encode_known(self, cps: bytes | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids of a text given by its code points `cps` (as `code_point_chunks` gives
        them), less its characters outside the vocabulary, and their positions in `cps`. In
        byte units the ids are the UTF-8 bytes of the characters all of whose bytes it holds."""
        if isinstance(cps, bytes):
            cps = np.frombuffer(cps, dtype=np.uint8)
        if self.units == "char":
            ids = gather(self._table, cps)
            bad = np.flatnonzero(ids == len(self))
            return np.delete(ids, bad).astype(self.dtype, copy=False), bad
        # by the distinct characters, so a chunk costs one pass whatever its script
        distinct = np.flatnonzero(np.bincount(cps)).tolist()
        out = [c for c in distinct if (b := utf8(chr(c))) is None
               or self._table[list(b)].max() == len(self)]
        bad = np.flatnonzero(np.isin(cps, out)) if out else np.zeros(0, dtype=np.intp)
        kept = np.delete(cps, bad).astype(np.uint32)  # no surrogate is kept: UTF-8 has none
        text = kept.tobytes().decode("utf-32-le").encode("utf-8")
        ids = gather(self._table, np.frombuffer(text, dtype=np.uint8))
        return ids.astype(self.dtype, copy=False), bad

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).astype(np.int64).tolist()

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of `ids`; in byte units their bytes decoded strictly as UTF-8."""
        # Through code points, not a numpy string array: that would drop U+0000 (NUL), which
        # numpy takes for padding.
        cps = self._code_points[np.asarray(ids, dtype=np.int64)]
        if self.units == "byte":
            return cps.astype(np.uint8).tobytes().decode("utf-8")
        return cps.tobytes().decode("utf-32-le", "surrogatepass")


class CharacterSet:
    """The characters met so far, added as code points in chunks (bytes or arrays, as
    `Vocab.encode_code_points` takes them), each chunk by one vectorised pass that changes
    nothing once every character of the chunk has been met before (most chunks of a text)."""

    def __init__(self) -> None:
        self._seen = np.zeros(MAX_CODE_POINT, dtype=np.uint8)
        self._seen_bytes = b""  # the code points below 256 met so far, one a byte
        self._since: list[np.ndarray] = []  # the code points first met since `begin`

    def add(self, cps: bytes | np.ndarray) -> None:
        if isinstance(cps, bytes):
            new = cps.translate(None, self._seen_bytes)  # what is left was not met before
            if new:
                self._met(np.frombuffer(new, dtype=np.uint8))
        elif len(cps) and gather(self._seen, cps).min() == 0:
            self._met(cps[gather(self._seen, cps) == 0])

    def _met(self, new: np.ndarray) -> None:
        self._since.append(np.unique(new))
        self._seen[new] = 1
        self._seen_bytes = np.flatnonzero(self._seen[:256]).astype(np.uint8).tobytes()

    def begin(self) -> None:
        """Start a text whose characters `undo` can take back (a file found bad midway)."""
        self._since = []

    def undo(self) -> None:
        """Forget the characters first met since `begin`."""
        for new in self._since:
            self._seen[new] = 0
        self._seen_bytes = np.flatnonzero(self._seen[:256]).astype(np.uint8).tobytes()
        self._since = []

    def vocab(self, units: str = "char") -> Vocab:
        """The vocabulary of the characters (byte units: byte values) met, in code point
        order."""
        return Vocab.from_code_points(np.flatnonzero(self._seen), units)


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
