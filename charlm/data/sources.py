"""The text files a dataset is made from: what the user named (files, folders walked with hidden
names skipped, quoted globs expanded here so they mean the same on every shell, `-` for stdin)
as `Source`s, each read once however often it is named. A .gz, .bz2 or .xz file is decompressed
as it streams; its bytes as stored are the ones hashed and counted, as `os.stat` counts them."""

from __future__ import annotations

import bz2
import contextlib
import errno
import fnmatch
import gzip
import hashlib
import lzma
import os
import shutil
import stat
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from charlm.core.errors import CharlmError
from charlm.data.chunks import InvalidText

GLOB_CHARS = frozenset("*?[")


def expand_glob(spec: str) -> tuple[str, list[tuple[str, bool]]]:
    """(the folder the matches are taken under, the matches sorted by path, each with whether
    it is a folder), as `glob.glob(recursive=True)` gives them, the tree under the literal head
    walked once by `os.walk`, which never follows a link to a folder (so `**` cannot loop)."""
    parts = spec.split("/")
    dirs_only = len(parts) > 1 and parts[-1] == ""  # `src/*/`: folders alone, as glob
    parts = [p for i, p in enumerate(parts) if p or i == 0]  # `a//b` is `a/b`
    head = 0
    while head < len(parts) - 1 and not GLOB_CHARS & set(parts[head]):
        head += 1
    prefix, pattern = parts[:head], parts[head:]
    root = "/".join(prefix) or ("/" if prefix else ".")
    found: list[tuple[str, bool]] = []
    for top, dirs, names in os.walk(root):
        rel = [] if top == root else os.path.relpath(top, root).split(os.sep)
        kept = []
        for d in sorted(dirs):
            if os.path.islink(os.path.join(top, d)):
                continue  # as the folder walk: a linked folder is not read
            if _match(pattern, [*rel, d], partial=False):
                found.append(("/".join([*prefix, *rel, d]), True))
            elif _match(pattern, [*rel, d], partial=True):
                kept.append(d)
        dirs[:] = kept
        found += [("/".join([*prefix, *rel, n]), False) for n in names
                  if not dirs_only and _match(pattern, [*rel, n], partial=False)]
    return root, sorted(found)


def _match(pattern: list[str], segments: list[str], partial: bool) -> bool:
    """Whether the path `segments` matches `pattern` (`partial`: whether a path below it may)."""
    if not segments:
        return partial or all(p == "**" for p in pattern)
    if not pattern:
        return False
    first, rest = pattern[0], pattern[1:]
    if first == "**":
        return (_match(rest, segments, partial)
                or (not segments[0].startswith(".") and _match(pattern, segments[1:], partial)))
    if segments[0].startswith(".") and not first.startswith("."):
        return False  # a hidden name is matched only by a pattern that starts with a dot
    return fnmatch.fnmatchcase(segments[0], first) and _match(rest, segments[1:], partial)


CODECS: dict[str, Callable[[Any], BinaryIO]] = {
    ".gz": lambda f: gzip.GzipFile(fileobj=f, mode="rb"), ".bz2": bz2.BZ2File,
    ".xz": lzma.LZMAFile}
TOOLS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}  # each codec's command, that can test it

@dataclass(frozen=True)
class Source:
    """One input file: `path` on disk, `name` as messages and meta.json show it, and `key`,
    its path under the folder or glob that brought it (what data.split files hashes)."""

    path: Path
    name: str
    key: str

    @property
    def codec(self) -> str | None:
        return self.path.suffix.lower() if self.path.suffix.lower() in CODECS else None

    @contextlib.contextmanager
    def open(self, bar: tqdm | None = None) -> Iterator[tuple[BinaryIO, HashingReader]]:
        """Its text bytes (decompressed) and the `HashingReader` of its bytes as stored."""
        try:
            raw = open(self.path, "rb")  # noqa: SIM115 - closed below
        except OSError as e:
            raise unreadable(self, e) from None
        with raw, HashingReader(raw, bar) as tap:
            if self.codec is None:
                yield tap, tap
            else:
                with CODECS[self.codec](tap) as stream:
                    yield stream, tap

    def damaged(self, e: BaseException) -> InvalidText:
        """The error for a compressed file whose data stops making sense or is cut short."""
        why = ("it ends before its end-of-stream marker (cut short?)" if isinstance(e, EOFError)
               else str(e) or type(e).__name__)
        return InvalidText(f"cannot decompress {self.name} as {self.codec} data: {why}; check "
                           f"the file (`{TOOLS[self.codec]} -t {self.name}`)", "damaged")


class HashingReader(contextlib.AbstractContextManager):
    """A binary file read through: every byte counted, shown on the progress bar and given to
    sha256 in order on a worker thread (hashlib lets go of the GIL, so hashing runs beside the
    encoding), no more than one chunk waiting. Leaving the `with` stops the thread."""

    def __init__(self, f: BinaryIO, bar: tqdm | None):
        self._f, self._bar = f, bar
        self.size = 0
        self._digest = hashlib.sha256()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="charlm-sha256")
        self._pending: Future | None = None

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        if data:
            self.update(data)
            self.size += len(data)
            if self._bar is not None:
                self._bar.update(len(data))
        return data

    def readable(self) -> bool:
        return True

    def update(self, chunk: bytes) -> None:
        # immutable bytes: the worker reads it later
        self._wait()
        self._pending = self._pool.submit(self._digest.update, chunk)

    def hexdigest(self) -> str:
        self._wait()
        return self._digest.hexdigest()

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)


READ_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error)


def unreadable(source: Source, e: OSError) -> CharlmError:
    if e.errno == errno.ELOOP:
        return InvalidText(f"input {source.name} is a symlink loop (too many levels of "
                           "symbolic links); fix the link", "symlink loop")
    if e.errno == errno.ENOENT:
        return CharlmError(f"input file not found: {source.name}")
    return InvalidText(f"cannot read {source.name}: {e.strerror or e}; fix its permissions",
                       "unreadable")


def list_sources(specs: Sequence[str | Path], include: Sequence[str] = (),
                 exclude: Sequence[str] = (), stdin: Path | None = None) -> list[Source]:
    """The files `specs` name, in their order (each folder's or glob's sorted), each once (by
    its real path); `-` is stdin, copied to the file `stdin`."""
    if not specs:
        raise CharlmError("no input files given")
    found: dict[str, Source] = {}
    for spec in map(str, specs):
        if spec == "-":
            if stdin is None:
                raise CharlmError("- (stdin) is not an input here; give a file")
            found.setdefault(os.path.realpath(stdin), Source(stdin, "<stdin>", "<stdin>"))
            continue
        for source in _expand(os.path.expanduser(spec), include, exclude):
            found.setdefault(os.path.realpath(source.path), source)
    return list(found.values())


def _expand(spec: str, include: Sequence[str], exclude: Sequence[str]) -> list[Source]:
    if GLOB_CHARS & set(spec) and not os.path.lexists(spec):
        root, matches = expand_glob(spec)
        if not matches:
            raise CharlmError(f"no file matches {spec}; check the pattern (charlm expands it: "
                              "quote it, and use ** for any depth)")
        files = [s for m, is_dir in matches for s in
                 (_walk(Path(m)) if is_dir else
                  [Source(Path(m), m, os.path.relpath(m, root))])]
        return _filtered(files, spec, include, exclude)
    path = Path(spec)
    try:
        is_dir = path.is_dir()
        path.stat()
    except OSError as e:
        raise unreadable(Source(path, spec, spec), e) from None
    if is_dir:
        return _filtered(_walk(path), spec, include, exclude)
    return [Source(path, spec, path.name)]


def _walk(folder: Path) -> list[Source]:
    files = []
    for top, dirs, names in os.walk(folder, onerror=_walk_error):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if not name.startswith("."):
                path = Path(top, name)
                files.append(Source(path, str(path), path.relative_to(folder).as_posix()))
    return sorted(files, key=lambda s: s.key)


def _walk_error(e: OSError) -> None:
    raise CharlmError(f"cannot list folder {e.filename}: {e.strerror}; fix its permissions")


def _filtered(files: list[Source], spec: str, include: Sequence[str],
              exclude: Sequence[str]) -> list[Source]:
    kept = [s for s in files
            if (not include or any(matches(s.key, p) for p in include))
            and not any(matches(s.key, p) for p in exclude)]
    if not kept:
        what = (f"{spec} holds no files" if not files else
                f"none of the {len(files):,} files of {spec} passes --include / --exclude")
        raise CharlmError(f"{what}; give a folder or pattern with text files in it")
    return kept


def matches(key: str, pattern: str) -> bool:
    """Whether `key` matches an --include / --exclude `pattern`: with a `/` by path, else name."""
    return fnmatch.fnmatchcase(key if "/" in pattern else key.rsplit("/", 1)[-1], pattern)


def missing_inputs(specs: Sequence[str]) -> list[str]:
    """The inputs of `specs` that name no file or folder (a glob and `-` name none up front)."""
    return [s for s in specs if s != "-" and not GLOB_CHARS & set(s)
            and not os.path.lexists(os.path.expanduser(s))]


@contextlib.contextmanager
def listed(specs: Sequence[str | Path], include: Sequence[str] = (),
           exclude: Sequence[str] = ()) -> Iterator[list[Source]]:
    """`list_sources` of `specs`, `-` read from a temporary copy of stdin while the block runs:
    prepare reads its inputs twice, and a pipe gives its bytes once."""
    if "-" not in map(str, specs):
        yield list_sources(specs, include, exclude)
        return
    with tempfile.NamedTemporaryFile(prefix="charlm-stdin-", suffix=".txt") as tmp:
        try:
            shutil.copyfileobj(sys.stdin.buffer, tmp)
            tmp.flush()
        except OSError as e:
            raise CharlmError(f"cannot copy stdin to {tmp.name}: {e.strerror}; save the text "
                              "to a file and give its path") from None
        yield list_sources(specs, include, exclude, Path(tmp.name))


def check_source_file(path: Path, name: str | None = None) -> None:
    """An input of `prepare` (named `name` in errors) must be a regular file: prepare reads it
    twice, a pipe (`<(cmd)`) gives its bytes once and a named pipe blocks."""
    name = str(path) if name is None else name
    try:
        regular = stat.S_ISREG(path.stat().st_mode)
    except OSError as e:
        raise unreadable(Source(path, name, name), e) from None
    if not regular:
        raise CharlmError(f"input is not a regular file (a pipe or a device): {name}; "
                          "charlm reads its text twice: give it as - (stdin), or save it to a "
                          "file first")
