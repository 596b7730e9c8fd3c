"""charlm.data.chunks: files read as UTF-8 in chunks of CHUNK_BYTES, characters cut by a chunk's
end decoded whole, a leading byte order mark dropped, ASCII chunks passed on undecoded."""



import codecs
import hashlib
import io

import numpy as np
import pytest

from charlm.core.errors import CharlmError
from charlm.data import chunks
from charlm.data.chunks import (
    CHUNK_BYTES,
    code_point_chunks,
    decode_chunks,
    narrow_code_points,
    sha256_file,
)

TEXT = "plain ascii\nnaïve café\nЖжж и 🙂 🚀\n𝄞 again ascii\n"


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 20])
def test_chunks_decode_to_the_text_whatever_their_size(monkeypatch, chunk):
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk)
    raw = TEXT.encode("utf-8")
    parts = list(decode_chunks(io.BytesIO(raw), "t.txt"))
    assert b"".join(r for r, _ in parts) == raw
    assert "".join(t for _, t in parts) == TEXT
    assert all(len(r) <= chunk for r, _ in parts)
    points = list(code_point_chunks(io.BytesIO(raw), "t.txt"))
    assert [r for r, _ in points] == [r for r, _ in parts]
    assert "".join(p.decode("latin-1") if isinstance(p, bytes) else "".join(map(chr, p))
                   for _, p in points) == TEXT


def test_chunks_bound_the_code_points_held_at_once(tmp_path, monkeypatch):
    """A file is never held whole: each chunk of code points is at most CHUNK_BYTES long, ASCII
    chunks as bytes, undecoded, and the others as arrays, whose concatenation is the text."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1000)
    text = "plain ascii text\n" * 500 + "Жжж 🙂\n" * 300 + "ascii again\n" * 200
    src = tmp_path / "t.txt"
    src.write_text(text, encoding="utf-8")
    with open(src, "rb") as f:
        parts = [cps for _, cps in code_point_chunks(f, str(src))]
    assert max(len(p) for p in parts) <= 1000
    assert {type(p) for p in parts} == {bytes, np.ndarray}
    assert "".join(p.decode("latin-1") if isinstance(p, bytes) else "".join(map(chr, p))
                   for p in parts) == text


def test_a_leading_byte_order_mark_is_dropped_and_counted_as_read(monkeypatch):
    """Only at the start of the file: U+FEFF elsewhere is a character of the text. The
    progress bar counts the bytes read, the mark's included."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 4)
    raw = codecs.BOM_UTF8 + "ab\ufeffcd".encode()

    class Bar:
        n = 0

        def update(self, n: int) -> None:
            self.n += n

    bar = Bar()
    assert "".join(t for _, t in decode_chunks(io.BytesIO(raw), "t.txt", bar)) == "ab\ufeffcd"
    assert bar.n == len(raw)


def test_an_ascii_chunk_is_passed_on_as_read():
    raw = b"hello world\n" * 10
    ((first, points), (last, rest)) = code_point_chunks(io.BytesIO(raw), "t.txt")
    assert points is first and first == raw  # not decoded, not copied
    assert (last, rest) == (b"", b"")  # the final read, empty


def test_narrow_code_points_are_bytes_below_256_else_an_array():
    assert narrow_code_points("café\n") == b"caf\xe9\n"
    wide = narrow_code_points("aЖ🙂")
    assert isinstance(wide, np.ndarray) and wide.dtype == np.uint32
    assert wide.tolist() == [ord("a"), 0x416, 0x1F642]


@pytest.mark.parametrize("raw, byte, offset", [
    (codecs.BOM_UTF8 + b"ab\xff", 0xFF, 5),  # the offset counts the byte order mark
    ("é".encode() * 3 + b"\xc3(", 0xC3, 6),  # a lead byte followed by ASCII
])
def test_an_invalid_byte_is_named_at_its_offset_in_the_file(monkeypatch, raw, byte, offset):
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 2)
    with pytest.raises(CharlmError) as e:
        list(decode_chunks(io.BytesIO(raw), "bad.txt"))
    assert str(e.value) == (f"bad.txt is not valid UTF-8 text (invalid byte 0x{byte:02x} at byte "
                            f"offset {offset}); charlm reads text files as UTF-8, convert it first")


def test_sha256_file_reads_in_chunks(tmp_path):
    path = tmp_path / "f.bin"
    raw = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 3)  # two chunks and a bit
    path.write_bytes(raw)
    assert sha256_file(path) == hashlib.sha256(raw).hexdigest()
