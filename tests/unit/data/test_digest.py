"""The sha256 of chunks hashed on a second thread: the same digest as hashlib's, in order, with
no more than one chunk waiting, and a worker that stops with the `with`."""

import hashlib
import threading

import pytest

from charlm.data import digest as digest_module
from charlm.data.chunks import CHUNK_BYTES
from charlm.data.digest import ChunkDigest, sha256_file


def test_chunks_hash_in_their_order_to_hashlibs_digest():
    chunks = [bytes([i]) * (1000 + 37 * i) for i in range(50)] + [b"", b"tail"]
    with ChunkDigest() as digest:
        for chunk in chunks:
            digest.update(chunk)
        assert digest.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()
    with ChunkDigest() as empty:
        assert empty.hexdigest() == hashlib.sha256().hexdigest()


def test_a_slow_hash_holds_no_more_than_one_chunk(monkeypatch):
    """A reader faster than the hash waits at its next `update`, so the chunks held for the
    worker never pile up (a 200 MB file would otherwise sit in memory)."""
    started, release, waiting = threading.Event(), threading.Event(), []
    real_sha256 = hashlib.sha256

    class Slow:
        def __init__(self):
            self.real = real_sha256()

        def update(self, chunk):
            started.set()
            release.wait(5)
            self.real.update(chunk)

        def hexdigest(self):
            return self.real.hexdigest()

    monkeypatch.setattr(digest_module.hashlib, "sha256", Slow)
    with ChunkDigest() as digest:
        digest.update(b"first")
        assert started.wait(5)
        blocked = threading.Thread(target=lambda: (digest.update(b"second"), waiting.append(1)))
        blocked.start()
        blocked.join(0.2)
        assert blocked.is_alive() and not waiting  # "second" waits for "first"
        release.set()
        blocked.join(5)
        assert waiting == [1]
        assert digest.hexdigest() == real_sha256(b"firstsecond").hexdigest()


def test_the_worker_stops_with_the_block_and_its_error_reaches_the_reader(monkeypatch):
    with ChunkDigest() as digest:
        digest.update(b"x")
    assert not [t for t in threading.enumerate() if t.name.startswith("charlm-sha256")]

    class Broken:
        def update(self, chunk):
            raise OSError("hash failed")

    monkeypatch.setattr(digest_module.hashlib, "sha256", Broken)
    with ChunkDigest() as digest, pytest.raises(OSError, match="hash failed"):
        digest.update(b"x")
        digest.hexdigest()


def test_sha256_file_reads_in_chunks(tmp_path):
    path = tmp_path / "f.bin"
    raw = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 3)  # two chunks and a bit
    path.write_bytes(raw)
    assert sha256_file(path) == hashlib.sha256(raw).hexdigest()
