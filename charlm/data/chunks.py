"""Text files read strictly as UTF-8 in chunks of `CHUNK_BYTES`, so memory stays bounded whatever
a file's size: each chunk as text (`decode_chunks`), or as code points in the narrowest form
(`code_point_chunks`, for `prepare`). A chunk of ASCII bytes is its own code points: it is not
decoded at all, and `Vocab.encode_code_points` maps it to ids with one `bytes.translate`.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np
from tqdm import tqdm

from charlm.core.errors import CharlmError
from charlm.data.vocab import code_points

# 1 MB: a chunk, its text (up to 4 bytes a character) and its code points stay a few MB, in the
# cache, and as fast to encode as larger chunks
CHUNK_BYTES = 1 << 20


def _chunks(f: BinaryIO, name: str, bar: tqdm | None) -> Iterator[tuple[bytes, bytes, str | None]]:
    """Yield (raw bytes, their text's bytes, the text) per chunk of `f`: the text's bytes are
    the raw bytes less a byte order mark that starts the file. The text is None when those bytes
    are ASCII and no character began in an earlier chunk: then they are the text, undecoded."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0  # bytes read before this chunk
    while True:
        raw = f.read(CHUNK_BYTES)
        final = not raw
        data = raw[3:] if offset == 0 and raw.startswith(codecs.BOM_UTF8) else raw
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the chunk's start
        text = None
        if pending or not data.isascii():
            try:
                text = decoder.decode(data, final=final)
            except UnicodeDecodeError as e:
                at = offset + len(raw) - len(data) - pending + e.start
                raise CharlmError(
                    f"{name} is not valid UTF-8 text (invalid byte 0x{e.object[e.start]:02x} at "
                    f"byte offset {at}); charlm reads text files as UTF-8, convert it first"
                ) from None
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


def code_point_chunks(f: BinaryIO, name: str, bar: tqdm | None = None
                      ) -> Iterator[tuple[bytes, bytes | np.ndarray]]:
    """Yield (raw bytes, the code points of their text) per chunk of `f`, decoded as
    `decode_chunks` does. The code points come as bytes when all are below 256 (a chunk of ASCII
    as it was read, Latin-1 text encoded back), else as a uint32 array, one per character."""
    for raw, data, text in _chunks(f, name, bar):
        yield raw, data if text is None else narrow_code_points(text)


def narrow_code_points(text: str) -> bytes | np.ndarray:
    """The code points of `text`: as bytes when all are below 256 (Python holds such a text one
    byte a character, so encoding it as Latin-1 is a copy), else as `code_points` gives them."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # raised at the first character above U+00FF
        return code_points(text)
