"""Text files read strictly as UTF-8 in chunks of `CHUNK_BYTES`, so memory stays bounded whatever
a file's size: each chunk as text (`decode_chunks`), or as code points in the narrowest form
(`code_point_chunks`, for `prepare`). A chunk of ASCII bytes is its own code points: it is not
decoded at all, and `Vocab.encode_code_points` maps it to ids with one `bytes.translate`.
`CharacterSet` gathers the characters met over a text's chunks, which make its vocabulary, and
`read_text` reads a whole text file (a prompt, an eval text, pairs) with the same errors.

sha256 of files read in chunks: `sha256_file` for a file alone, and `ChunkDigest`, which hashes
the chunks a reader works on, on a second thread (hashlib lets go of the GIL while it hashes a
large buffer, so hashing runs beside the encoding: docs/benchmarks.md)."""

from __future__ import annotations

import codecs
import hashlib
import io
import re
import sys
import unicodedata
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np
from tqdm import tqdm

from charlm.core.errors import CharlmError
from charlm.core.files import missing, open_regular, read_capped
from charlm.data.vocab import MAX_CODE_POINT, Vocab, code_points, gather

# 1 MB: a chunk, its text (up to 4 bytes a character) and its code points stay a few MB, in the
# cache, and as fast to encode as larger chunks
CHUNK_BYTES = 1 << 20

# the first bytes of files that are compressed, not text: a hint in the error for them
MAGIC = {b"\x1f\x8b": ("gzip", ".gz"), b"BZh": ("bzip2", ".bz2"),
         b"\xfd7zXZ\x00": ("xz", ".xz"), b"PK\x03\x04": ("zip", None)}


# what `prepare` adds to an `InvalidText`'s message
SKIP_HINT = "or pass --skip-invalid (data.skip_invalid) to skip such files"


class InvalidText(CharlmError):
    """An input that is not a UTF-8 text file charlm can read (binary, invalid UTF-8, empty,
    damaged, unreadable): `--skip-invalid` skips it, counted by `reason`."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def not_text(name: str, why: str, at: int, head: bytes, reason: str) -> InvalidText:
    """The error for a file that is not UTF-8 text: `why`, at byte offset `at`, with a hint when
    its first bytes (`head`) say it is compressed."""
    hint = "charlm reads text files as UTF-8, convert it first"
    for magic, (kind, suffix) in MAGIC.items():
        if head.startswith(magic):
            hint = (f"it looks {kind}-compressed: name it *{suffix} and charlm decompresses it"
                    if suffix else f"it looks like a {kind} archive: extract it first")
    if reason == "binary" and hint.startswith("charlm"):
        hint = "a binary file? charlm reads UTF-8 text files"
    return InvalidText(f"{name} is not valid UTF-8 text ({why} at byte offset {at}); {hint}",
                       reason)


def _chunks(f: BinaryIO, name: str, bar: tqdm | None) -> Iterator[tuple[bytes, bytes, str | None]]:
    """Yield (raw bytes, their text's bytes, the text) per chunk of `f`: the text's bytes are
    the raw bytes less a byte order mark that starts the file. The text is None when those bytes
    are ASCII and no character began in an earlier chunk: then they are the text, undecoded.
    A NUL byte (a binary file) or an invalid byte sequence is an error (`not_text`)."""
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
    """Yield (raw bytes, decoded text) per chunk of `f`, decoding strictly as UTF-8. A byte order
    mark at the start marks the encoding and is not text: it is dropped.

    An invalid byte sequence is an error naming `name` and the byte offset where it starts.
    """
    for raw, data, text in _chunks(f, name, bar):
        yield raw, data.decode("ascii") if text is None else text


def code_point_chunks(f: BinaryIO, name: str, bar: tqdm | None = None,
                      normalize: str | None = None) -> Iterator[tuple[bytes, bytes | np.ndarray]]:
    """Yield (raw bytes, the code points of their text) per chunk of `f`, decoded as
    `decode_chunks` does, and put in the Unicode normal form `normalize` (NFC, NFKC, NFD, NFKD)
    if given. The code points come as bytes when all are below 256 (a chunk of ASCII as it was
    read, Latin-1 text encoded back), else as a uint32 array, one per character."""
    carry = ""  # the text from the chunk's last ASCII character on, normalized with the next
    for raw, data, text in _chunks(f, name, bar):
        if normalize is None:
            yield raw, data if text is None else narrow_code_points(text)
            continue
        text = carry + (data.decode("ascii") if text is None else text)
        cut = len(text) if not raw or len(text) > 4 * CHUNK_BYTES else _last_ascii(text)
        carry = text[cut:]
        yield raw, narrow_code_points(unicodedata.normalize(normalize, text[:cut]))


_ASCII_TAIL = re.compile(r"[\x00-\x7f][^\x00-\x7f]*\Z")


def _last_ascii(text: str) -> int:
    """Where the last ASCII character of `text` starts (0 if none). A normal form never joins
    characters across it (no composition takes an ASCII character second, and it is a starter),
    so the text before it normalizes alone as it would in the whole."""
    match = _ASCII_TAIL.search(text)
    return match.start() if match else 0


def narrow_code_points(text: str) -> bytes | np.ndarray:
    """The code points of `text`: as bytes when all are below 256 (Python holds such a text one
    byte a character, so encoding it as Latin-1 is a copy), else as `code_points` gives them."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # raised at the first character above U+00FF
        return code_points(text)


def byte_chunks(f: BinaryIO) -> Iterator[tuple[bytes, bytes]]:
    """`code_point_chunks` in byte units (`charlm.data.vocab`): (raw bytes, the same bytes) per
    chunk, each byte its own code point. Nothing is decoded, so any file is valid."""
    while raw := f.read(CHUNK_BYTES):
        yield raw, raw


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class ChunkDigest:
    """The sha256 of the chunks given to `update`, in their order, hashed on a worker thread.
    `update` first waits for the chunk before, so no more than one chunk waits to be hashed
    (memory stays bounded whatever the reader's speed). A context manager: leaving it stops
    the thread."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="charlm-sha256")
        self._pending: Future | None = None

    def update(self, chunk: bytes) -> None:
        """Hash `chunk` (immutable bytes: the worker reads it later) after the ones before."""
        self._wait()
        self._pending = self._pool.submit(self._digest.update, chunk)

    def hexdigest(self) -> str:
        self._wait()
        return self._digest.hexdigest()

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __enter__(self) -> ChunkDigest:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._pool.shutdown(wait=True)


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


def check_input_file(path: Path) -> None:
    if not path.exists():
        raise missing(path, "input file")
    if path.is_dir():
        raise CharlmError(f"input is a directory, not a text file: {path}")


def read_text(path: Path, what: str = "text file", limit: int | None = None) -> str:
    """A whole text file, read strictly as UTF-8 (with the same errors as `prepare`): a
    regular file (named `what` in errors), of at most `limit` bytes if given; `-` is stdin."""
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
