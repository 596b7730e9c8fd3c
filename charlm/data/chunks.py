"""Text files read strictly as UTF-8 in chunks of `CHUNK_BYTES`, so memory stays bounded
whatever a file's size, as text or as code points (an ASCII chunk is its own code points, never
decoded); the characters a text's chunks hold; and the hashes prepare keys files by."""

from __future__ import annotations

import codecs
import hashlib
import io
import re
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
from tqdm import tqdm

from charlm.core.errors import CharlmError
from charlm.core.files import missing, open_regular, read_capped
from charlm.data.vocab import MAX_CODE_POINT, Vocab, code_points, gather

# a chunk, its text (up to 4 bytes a character) and its code points stay a few MB, in the cache
CHUNK_BYTES = 1 << 20

_ASCII_TAIL = re.compile(r"[\x00-\x7f][^\x00-\x7f]*\Z")  # from the last ASCII character on

# the first bytes of files that are compressed, not text: a hint in the error for them
MAGIC = {b"\x1f\x8b": ("gzip", ".gz"), b"BZh": ("bzip2", ".bz2"),
         b"\xfd7zXZ\x00": ("xz", ".xz"), b"PK\x03\x04": ("zip", None)}


class InvalidText(CharlmError):
    """An input that is not UTF-8 text charlm can read: `--skip-invalid` skips it by `reason`."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def not_text(name: str, why: str, at: int, head: bytes, reason: str) -> InvalidText:
    """The error for a file not UTF-8 text, with a hint when its `head` says it is compressed."""
    hint = ("a binary file? charlm reads UTF-8 text files" if reason == "binary" else
            "charlm reads text files as UTF-8, convert it first")
    for magic, (kind, suffix) in MAGIC.items():
        if head.startswith(magic):
            hint = (f"it looks {kind}-compressed: name it *{suffix} and charlm decompresses it"
                    if suffix else f"it looks like a {kind} archive: extract it first")
    return InvalidText(f"{name} is not valid UTF-8 text ({why} at byte offset {at}); {hint}",
                       reason)


def _chunks(f: BinaryIO, name: str, bar: tqdm | None) -> Iterator[tuple[bytes, bytes, str | None]]:
    """(raw bytes, their text's bytes, the text) per chunk of `f`: the text's bytes less a byte
    order mark that starts the file, the text None when they are ASCII and no character began in
    an earlier chunk. A NUL byte or an invalid byte sequence is an error naming its offset."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset, head = 0, b""  # bytes read before this chunk; the file's first bytes
    while True:
        raw = f.read(CHUNK_BYTES)
        final = not raw
        head = head or raw[:8]
        data = raw[3:] if offset == 0 and raw.startswith(codecs.BOM_UTF8) else raw
        nul = raw.find(b"\0")
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the chunk's start
        text = None
        if pending or not data.isascii():
            try:
                text = decoder.decode(data, final=final)
            except UnicodeDecodeError as e:
                at = offset + len(raw) - len(data) - pending + e.start
                if nul < 0 or offset + nul > at:  # the first fault is the one named
                    raise not_text(name, f"invalid byte 0x{e.object[e.start]:02x}", at, head,
                                   "not UTF-8") from None
        if nul >= 0:
            raise not_text(name, "a NUL byte", offset + nul, head, "binary")
        offset += len(raw)
        if bar is not None:
            bar.update(len(raw))
        yield raw, data, text
        if final:
            return


def decode_chunks(f: BinaryIO, name: str, bar: tqdm | None = None
                  ) -> Iterator[tuple[bytes, str]]:
    """(raw bytes, their text) per chunk of `f`."""
    for raw, data, text in _chunks(f, name, bar):
        yield raw, data.decode("ascii") if text is None else text


def code_point_chunks(f: BinaryIO, name: str, bar: tqdm | None = None,
                      normalize: str | None = None, units: str = "char"
                      ) -> Iterator[tuple[bytes, bytes | np.ndarray]]:
    """(raw bytes, the code points of their text) per chunk of `f`, in the Unicode normal form
    `normalize` if given, as `narrow_code_points` gives them (an ASCII chunk as it was read);
    in byte units each byte is its own code point and any file is valid."""
    if units == "byte":
        while raw := f.read(CHUNK_BYTES):
            if bar is not None:
                bar.update(len(raw))
            yield raw, raw
        return
    carry = ""  # the text from the chunk's last ASCII character on, normalized with the next
    for raw, data, text in _chunks(f, name, bar):
        if normalize is None:
            yield raw, data if text is None else narrow_code_points(text)
            continue
        text = carry + (data.decode("ascii") if text is None else text)
        # cut at the last ASCII character, a starter that no composition takes second, so the
        # text before it normalizes alone as in the whole (all of it at the end of the file)
        whole = not raw or len(text) > 4 * CHUNK_BYTES
        last = None if whole else _ASCII_TAIL.search(text)
        cut = len(text) if whole else last.start() if last else 0
        carry = text[cut:]
        yield raw, narrow_code_points(unicodedata.normalize(normalize, text[:cut]))


def narrow_code_points(text: str) -> bytes | np.ndarray:
    """The code points of `text`: bytes if all are below 256 (as Latin-1, a copy), else uint32."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # raised at the first character above U+00FF
        return code_points(text)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class CharacterSet:
    """The characters met so far, added a chunk of code points at a time by one vectorised
    pass that changes nothing once every character of the chunk has been met before."""

    def __init__(self) -> None:
        self._seen = np.zeros(MAX_CODE_POINT, dtype=np.uint8)
        self._since: list[np.ndarray] = []  # the code points first met since `begin`

    def add(self, cps: bytes | np.ndarray) -> None:
        if isinstance(cps, bytes):  # translate deletes the code points below 256 met before
            seen = np.flatnonzero(self._seen[:256]).astype(np.uint8).tobytes()
            new = np.frombuffer(cps.translate(None, seen), dtype=np.uint8)
        else:
            met = gather(self._seen, cps)
            new = cps[:0] if met.all() else cps[met == 0]  # the common case makes no mask
        if len(new):
            self._since.append(np.unique(new))
            self._seen[new] = 1

    def begin(self) -> None:
        """Start a text whose characters `undo` can take back (a file found bad midway)."""
        self._since = []

    def undo(self) -> None:
        """Forget the characters first met since `begin`."""
        for new in self._since:
            self._seen[new] = 0
        self._since = []

    def vocab(self, units: str = "char") -> Vocab:
        """The vocabulary of the characters (byte units: byte values) met."""
        return Vocab("".join(map(chr, np.flatnonzero(self._seen))), units)  # in code point order


def check_input_file(path: Path) -> None:
    if not path.exists():
        raise missing(path, "input file")
    if path.is_dir():
        raise CharlmError(f"input is a directory, not a text file: {path}")


def read_text(path: Path, what: str = "text file", limit: int | None = None) -> str:
    """A whole regular text file (`-`: stdin) of at most `limit` bytes, named `what` in errors."""
    if str(path) == "-":
        stdin = sys.stdin.buffer
        source = stdin if limit is None else io.BytesIO(read_capped(stdin, limit, "stdin"))
        return "".join(text for _, text in decode_chunks(source, "<stdin>"))
    path = Path(path)
    check_input_file(path)
    with open_regular(path, what, limit) as f:
        # with a limit, a file that grows while it is read stops at it too
        source = f if limit is None else io.BytesIO(read_capped(f, limit, f"{what} {path}"))
        return "".join(text for _, text in decode_chunks(source, str(path)))


def path_share(key: str) -> float:
    """Where `key` falls in [0, 1), by its sha256: a file's path (data.split files) or a pair's
    source stays on its side of a split whatever else comes and goes."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
