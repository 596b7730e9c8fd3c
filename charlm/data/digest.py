"""sha256 of files read in chunks: `sha256_file` for a file alone, and `ChunkDigest`, which
hashes the chunks a reader works on, on a second thread.

hashlib lets go of the GIL while it hashes a large buffer, so `prepare`'s passes (count and
encode the chunks, and hash them) take on two cores about what their other work takes: sha256
runs about as fast as the encoding beside it (docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from charlm.data.chunks import CHUNK_BYTES


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
