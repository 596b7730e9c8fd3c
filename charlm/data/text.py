"""Text datasets: `prepare` (text files -> meta.json + train.bin + val.bin), the input checks
and the reading of meta.json. Loading a dataset dir back is `charlm.data.dataset`'s.

`prepare` reads each input twice in fixed-size chunks (`charlm.data.chunks`; pass 1: sha256,
character count and the set of code points; pass 2: encode and write, and sha256 again, to catch a
file that changed between the passes), so memory stays bounded whatever the file size, and every
step is a bytes or numpy operation over a whole chunk, never a Python loop over characters. The
sha256 runs on a second thread beside the rest (`charlm.data.digest`). It imports no torch, so
`charlm prepare` starts fast.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from tqdm import tqdm

from charlm.core.errors import CharlmError
from charlm.core.files import (
    locked_dir,
    make_writable_dir,
    open_regular,
    read_capped,
    read_regular,
    remove_temps,
    temp_beside,
    write_text_atomic,
)
from charlm.data.chunks import code_point_chunks, decode_chunks
from charlm.data.digest import ChunkDigest
from charlm.data.vocab import CharacterSet, Vocab

if TYPE_CHECKING:
    pass


DATASET_FORMAT = "charlm-dataset"


DATASET_FILES = ("meta.json", "train.bin", "val.bin")


DATASET_VERSION = 1


PROGRESS_MIN_BYTES = 4 << 20


# meta.json (and an export's vocab.json) hold a vocabulary: even every Unicode character, one a
# line, stays below this; a file far larger is not charlm's and would fill the memory
META_LIMIT = 16 << 20


def check_input_file(path: Path) -> None:
    if not path.exists():
        raise CharlmError(f"input file not found: {path}")
    if path.is_dir():
        raise CharlmError(f"input is a directory, not a text file: {path}")


def check_source_file(path: Path) -> None:
    """An input of `prepare`, which reads it twice (pass 1, pass 2): a regular file. A pipe
    (`<(cmd)`) gives its bytes once, so pass 2 would write no ids, and a named pipe blocks."""
    check_input_file(path)
    if not path.is_file():
        raise CharlmError(f"input is not a regular file (a pipe or a device): {path}; charlm "
                          "reads its text twice, save it to a file first")


def read_text(path: Path, what: str = "text file", limit: int | None = None) -> str:
    """A whole text file, read strictly as UTF-8 (with the same errors as `prepare`): a
    regular file (named `what` in errors), of at most `limit` bytes if given."""
    path = Path(path)
    check_input_file(path)
    with open_regular(path, what, limit) as f:
        # with a limit, a file that grows while it is read stops at it too
        source = f if limit is None else io.BytesIO(read_capped(f, limit, f"{what} {path}"))
        return "".join(text for _, text in decode_chunks(source, str(path)))


@dataclass
class SourceStats:
    path: Path
    bytes: int
    chars: int
    sha256: str


def _scan(path: Path, seen: CharacterSet, bar: tqdm | None) -> SourceStats:
    """Pass 1: hash, count characters and add every character that occurs to `seen`."""
    n_bytes = n_chars = 0
    with open(path, "rb") as f, ChunkDigest() as digest:
        for raw, cps in code_point_chunks(f, str(path), bar):
            digest.update(raw)
            n_bytes += len(raw)
            n_chars += len(cps)
            seen.add(cps)
        return SourceStats(path, n_bytes, n_chars, digest.hexdigest())


def scan(paths: Sequence[Path], bar: tqdm | None = None) -> tuple[list[SourceStats], Vocab]:
    """Pass 1 over every input: per-file stats and the vocabulary of all of them together."""
    for p in paths:
        check_source_file(p)
    seen = CharacterSet()
    stats = [_scan(p, seen, bar) for p in paths]
    for s in stats:
        if s.chars == 0:
            raise CharlmError(f"input file is empty: {s.path}; give it some text to learn from")
    vocab = seen.vocab()
    if len(vocab) < 2:
        raise CharlmError(
            f"{', '.join(str(p) for p in paths)} holds only one distinct character "
            f"({vocab.chars[0]!r}); a language model needs at least two, give it real text"
        )
    return stats, vocab


def _encode(s: SourceStats, vocab: Vocab, n_train: int, ftrain: BinaryIO, fval: BinaryIO,
            bar: tqdm | None) -> None:
    """Pass 2 over one input: its first n_train ids to ftrain, the rest to fval. What it reads
    must be what pass 1 read (`s`: the same characters and sha256), else the file changed."""
    done = 0
    with open(s.path, "rb") as f, ChunkDigest() as digest:
        for raw, cps in code_point_chunks(f, str(s.path), bar):
            digest.update(raw)
            try:
                ids = memoryview(vocab.encode_code_points(cps))  # bytes or an array
            except CharlmError:  # a character the first read did not see
                raise changed_while_read(s.path) from None
            cut = min(max(n_train - done, 0), len(ids))
            ftrain.write(ids[:cut])
            fval.write(ids[cut:])
            done += len(ids)
        if (done, digest.hexdigest()) != (s.chars, s.sha256):
            raise changed_while_read(s.path)


def changed_while_read(path: Path) -> CharlmError:
    return CharlmError(f"{path} changed while prepare read it (the two reads differ); run it "
                       "again once nothing writes to the file")


def read_meta(path: Path) -> Any:
    """The parsed meta.json of the directory `path`, whatever JSON it holds. Raises OSError
    (FileNotFoundError when there is none) or ValueError (not JSON, not UTF-8)."""
    return json.loads(read_regular(path / "meta.json", "dataset metadata", META_LIMIT)
                      .decode("utf-8"))


def dataset_meta(path: Path) -> dict[str, Any] | None:
    """The meta.json of the directory `path` if it is a charlm dataset's, else None (missing,
    unreadable, or another tool's)."""
    try:
        meta = read_meta(path)
    except (ValueError, OSError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == DATASET_FORMAT else None


def replaceable(out: Path) -> bool:
    """Whether `prepare` may write into the existing directory `out`: one that holds a charlm
    dataset (its meta.json says so: a meta.json of another tool is not ours to overwrite), or
    nothing but dataset files and the hidden .NAME.tmp-PID files of a killed prepare, with a
    meta.json missing or damaged (a prepare or a machine stopped between moving the .bin files
    into place and writing meta.json, say in a run's own dataset cache)."""
    if dataset_meta(out) is not None:
        return True
    if not all(p.name.startswith(".") or p.name in DATASET_FILES for p in out.iterdir()):
        return False
    try:  # only dataset files: replaceable unless meta.json is another tool's
        read_meta(out)
    except FileNotFoundError:
        return True
    except (ValueError, OSError):  # damaged (cut short by a crash) beside our .bin files
        return any((out / name).exists() for name in ("train.bin", "val.bin"))
    return False


def dataset_lock(out: Path) -> contextlib.AbstractContextManager[None]:
    """The lock a prepare holds on its dataset dir (`locked_dir`), so that two prepares into
    one dir never mix one's meta.json with the other's data files."""
    return locked_dir(out, f"dataset dir {out} is in use by another `charlm prepare` (or a "
                           "`charlm train` preparing its data); wait for it to end, or choose "
                           "another --out")


def install(out: Path, finals: Iterable[Path], meta: dict[str, Any]) -> None:
    """Move the written temporaries (`temp_beside`) of a dataset's `finals` into place, then
    write its meta.json. The old meta.json goes first: stopped between the moves, the dir holds
    no meta.json beside a mix of old and new files, which no reader takes for a dataset."""
    (out / "meta.json").unlink(missing_ok=True)
    for path in finals:
        os.replace(temp_beside(path), path)
    write_text_atomic(out / "meta.json", json.dumps(meta, ensure_ascii=False, indent=1))


def discard_temps(finals: Iterable[Path]) -> None:
    """Remove the temporaries of `finals` that a stopped prepare wrote (while it is stopping:
    an OSError here must not hide the error being raised)."""
    for path in finals:
        with contextlib.suppress(OSError):
            temp_beside(path).unlink(missing_ok=True)


def remove_killed_temps(out: Path, names: Sequence[str]) -> None:
    """Remove the .NAME.tmp-PID files of `names` in `out` that a killed process left."""
    for name in names:
        remove_temps(out / name, only_dead=True)


def prepare(
    inputs: Sequence[str | Path], out: str | Path, val_fraction: float = 0.1,
    progress: bool = True,
) -> dict[str, Any]:
    """Encode text files into a dataset directory; returns the metadata written to meta.json.

    The validation split is the last `val_fraction` of each input, so the split of one file is the
    same as nanoGPT's (`n_train = int(n * (1 - val_fraction))`). It holds the dataset dir's
    lock throughout, and whatever stops it (an error, SIGINT, SIGTERM) removes its temporaries.
    """
    paths, out = [Path(p) for p in inputs], Path(out)
    with dataset_lock(out):
        check_prepare(paths, out, val_fraction)
        total = sum(p.stat().st_size for p in paths)
        bar = tqdm(total=2 * total, unit="B", unit_scale=True, desc="prepare",
                   disable=True if not progress or total < PROGRESS_MIN_BYTES else None)
        final = {split: out / f"{split}.bin" for split in ("train", "val")}
        try:
            stats, vocab = scan(paths, bar)
            make_writable_dir(out, f"dataset dir {out}")
            remove_killed_temps(out, DATASET_FILES)
            sizes = write_splits(stats, vocab, final, val_fraction, bar)
            meta = {
                "format": DATASET_FORMAT,
                "version": DATASET_VERSION,
                "vocab": vocab.chars,
                "vocab_size": len(vocab),
                "dtype": vocab.dtype.name,
                "val_fraction": val_fraction,
                "train_tokens": sizes["train"],
                "val_tokens": sizes["val"],
                "sources": [
                    {"path": str(s.path), "bytes": s.bytes, "chars": s.chars, "sha256": s.sha256}
                    for s in stats
                ],
            }
            install(out, final.values(), meta)
        except BaseException:
            discard_temps(final.values())
            raise
        finally:
            bar.close()
    return meta


def check_prepare(paths: list[Path], out: Path, val_fraction: float) -> None:
    """`prepare`'s refusals, before it reads anything: a split fraction outside (0, 1), no
    inputs or an input that is not a readable file, an --out that is a file or a non-empty
    directory that holds no dataset."""
    if not 0 < val_fraction < 1:
        raise CharlmError(f"--val-fraction must be in (0, 1), got {val_fraction}")
    if not paths:
        raise CharlmError("no input files given")
    for p in paths:
        check_source_file(p)  # before reading any sizes
    if out.exists() and not out.is_dir():
        raise CharlmError(f"--out must be a directory, but {out} is a file")
    if out.is_dir() and not replaceable(out):
        raise CharlmError(f"--out {out} is not empty and holds no charlm dataset; give a new or "
                          "empty directory, or a dataset dir to replace")


def write_splits(stats: Sequence[SourceStats], vocab: Vocab, final: dict[str, Path],
                 val_fraction: float, bar: tqdm) -> dict[str, int]:
    """Encode each source's first 1 - val_fraction into the temp file beside final["train"]
    and the rest beside final["val"], synced to disk; the tokens written to each."""
    sizes = {"train": 0, "val": 0}
    with (open(temp_beside(final["train"]), "wb") as ftrain,
          open(temp_beside(final["val"]), "wb") as fval):
        for s in stats:
            n_train = int(s.chars * (1 - val_fraction))
            _encode(s, vocab, n_train, ftrain, fval, bar)
            sizes["train"] += n_train
            sizes["val"] += s.chars - n_train
        for f in (ftrain, fval):
            f.flush()
            os.fsync(f.fileno())
    return sizes
