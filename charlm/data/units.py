"""What a vocabulary's units are: characters (`char`) or the bytes of the text's UTF-8 (`byte`).

A byte vocabulary is stored as characters too: byte value b is the character with code point b
(Latin-1), so byte 0xC3 is "\\u00c3". Preparing text in byte units then runs the character
machinery unchanged over the raw bytes (a chunk's code points ARE its bytes, nothing is
decoded), and any file in any script is representable. This module holds what differs: which
characters of a text a byte vocabulary cannot spell, the tail of a text that fits a context,
and `TextStream`, the one way ids become text as they are generated, a character at a time.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence

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
