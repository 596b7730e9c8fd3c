"""Files written beside their target under a temporary name, then `os.replace`d: readers see the
old file or the new, never a mix; files read whole only when regular and bounded (a FIFO would
block, /dev/zero fill the memory); and the lock on a directory, so two never write into one."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import re
import shutil
import stat
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from charlm.core.errors import CharlmError

# `make_writable_dir`'s probe: another torchrun rank may list the run dir while it is there
PROBE = ".write-test-"


def temp_beside(path: Path, tag: str = "tmp") -> Path:
    """`.NAME.TAG-PID` beside `path`: hidden, one per process."""
    return path.with_name(f".{path.name}.{tag}-{os.getpid()}")


def remove_temps(path: Path, tag: str = "tmp", only_dead: bool = False) -> None:
    """Remove the temporaries of `temp_beside(path, tag)` a killed process left (files or
    directories): any, or with `only_dead` those of processes that no longer run."""
    for tmp in dead_temps(path, tag) if only_dead else _temps(path, tag):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.is_file():
            tmp.unlink(missing_ok=True)


def dead_temps(path: Path, tag: str = "tmp") -> list[Path]:
    """The temporaries of `temp_beside(path, tag)` whose process no longer runs (and this one's:
    a dead process's whose PID it reuses), sorted."""
    return [tmp for tmp in _temps(path, tag)
            if int(pid := tmp.name.rsplit("-", 1)[1]) == os.getpid() or not alive(int(pid))]


def _temps(path: Path, tag: str) -> list[Path]:
    prefix = f".{path.name}.{tag}-"
    return sorted(p for p in path.parent.glob(f"{glob.escape(prefix)}*")
                  if p.name[len(prefix):].isdigit())


def strangers(directory: Path, own: Collection[str]) -> list[str]:
    """The names in `directory` that are neither one of `own` nor a temporary of one, sorted:
    files (a user's notes, .git/) charlm must neither remove nor bury its own among."""
    return sorted(p.name for p in directory.iterdir() if p.name not in own
                  and _temp_of(p.name) not in own and not p.name.startswith(PROBE))


def some(names: Sequence[str], most: int = 5) -> str:
    """The first `most` of `names`, for a one-line error: `a, b, c, ...`."""
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def _temp_of(name: str) -> str | None:
    """NAME of a `.NAME.TAG-PID` temporary name, else None."""
    match = re.fullmatch(r"\.(.+)\.[a-z]+-[0-9]+", name)
    return match and match.group(1)


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a dead one's temporaries are litter, its trials orphans)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # none; a PID out of range
        return False
    except PermissionError:  # another user's process: it runs
        pass
    return True


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """`write_files_atomic` of the one file `path`."""
    write_files_atomic([path], lambda temps: write(temps[0]))


def write_files_atomic(finals: Sequence[Path], write: Callable[[list[BinaryIO]], object],
                       before_move: Callable[[], object] = lambda: None) -> None:
    """Replace each of `finals` with what `write` writes into its temporary, all fsynced before
    `before_move` and the moves, so a crash leaves the old file or the new one; on failure no
    temporary is left (and a file not yet moved is as it was)."""
    try:
        with contextlib.ExitStack() as stack:
            temps = [stack.enter_context(open(temp_beside(path), "wb")) for path in finals]
            write(temps)
            for f in temps:
                f.flush()
                os.fsync(f.fileno())
        before_move()
        for path in finals:
            os.replace(temp_beside(path), path)
    except BaseException:
        for path in finals:  # without hiding the error being raised
            with contextlib.suppress(OSError):
                temp_beside(path).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """`write_atomic` of `text` in UTF-8; an OSError names `path`, not the temporary file."""
    data = text.encode("utf-8")
    try:
        write_atomic(path, lambda f: f.write(data))
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from None


def make_writable_dir(path: Path, what: str) -> None:
    """Make `path` if needed and check that it takes a file, else a CharlmError naming `what`."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f"{PROBE}{os.getpid()}-{id(path)}"  # one per process (DDP ranks)
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise CharlmError(f"cannot write to {what}: {e.strerror}; choose another --out") from None


def run_write_error(what: str, e: OSError, run_dir: Path, kept: str = "") -> CharlmError:
    """The error for a run file that could not be written: which, why, and how the run goes on
    (--resume from its last.pt, or, before it has one, starting again)."""
    then = ("continue with --resume" if (run_dir / "last.pt").is_file() else
            "start the run again with --overwrite (it has no last.pt to resume from yet)")
    return CharlmError(f"cannot write {what}: {e.strerror or e}; {kept}free disk space (or fix "
                       f"the run dir), then {then}")


@contextlib.contextmanager
def locked_dir(path: Path, busy: str) -> Iterator[None]:
    """Hold an exclusive flock on the directory `path` (made if needed, removed if still empty)
    while the block runs, so a second writer is refused with the CharlmError `busy`. No lock
    file: the lock goes with the process, even on SIGKILL."""
    for _ in range(10):
        made = [d for d in (path, *path.parents) if not d.exists()]  # deepest first
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CharlmError(busy) from None
        except OSError:  # a filesystem without locks (some network mounts): go on unlocked
            break
        try:  # locked: is it still the directory at path? (a failed command removes its own)
            if os.path.samestat(os.stat(path), os.fstat(fd)):
                break
        except OSError:
            pass
        os.close(fd)
    else:
        raise CharlmError(f"{path} keeps being removed by another process; choose another --out")
    try:
        yield
    finally:
        for d in made:  # removed while the lock is held, so no other process can have taken it
            try:
                d.rmdir()  # only an empty directory
            except OSError:
                break
        os.close(fd)


def locked(path: Path) -> bool:
    """Whether another process holds `path` with `locked_dir`."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:  # another error: a filesystem without locks
        return isinstance(e, BlockingIOError)
    finally:
        os.close(fd)
    return False


def locked_parent(path: Path) -> Path | None:
    """The nearest directory above `path` another process holds with `locked_dir`, or None."""
    return next((parent for parent in path.absolute().parents if locked(parent)), None)


def open_regular(path: Path, what: str, limit: int | None = None) -> BinaryIO:
    """`path` opened to read if it is a regular file (of at most `limit` bytes), else a
    CharlmError naming `what`. O_NONBLOCK keeps a FIFO's open from waiting, and fstat checks
    the opened descriptor, so nothing can swap the file; a missing one is an OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CharlmError(f"cannot read {what} {path}: not a regular file (a directory, FIFO "
                              "or device); give a regular file")
        if limit is not None and st.st_size > limit:
            raise too_large(f"{what} {path}", limit)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def missing(path: Path, what: str, absent: str | None = None) -> CharlmError:
    """The error for `what` at `path`, which cannot be opened: not found (`absent`, if given), or
    what `Path.exists()` calls not found too (a link loop, a dangling link, an unsearchable dir)."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return CharlmError(f"cannot read {what} {path}: a symlink loop (too many levels of "
                               "symbolic links); fix or remove the link")
        if e.errno == errno.ENOENT and os.path.islink(path):
            return CharlmError(f"cannot read {what} {path}: a symlink to {os.readlink(path)}, "
                               "which does not exist; fix or remove the link")
        if e.errno != errno.ENOENT:
            return CharlmError(f"cannot read {what} {path}: {e.strerror}")
    return CharlmError(absent or f"{what} not found: {path}")


def read_capped(f: BinaryIO, limit: int, name: str) -> bytes:
    """All of `f` (a pipe may never end) if it holds at most `limit` bytes, else a CharlmError."""
    data = f.read(limit + 1)
    if len(data) > limit:
        raise too_large(name, limit)
    return data


def read_regular(path: Path, what: str, limit: int) -> bytes:
    """The bytes of the regular file `path`, at most `limit` even if it grows as it is read."""
    with open_regular(path, what, limit) as f:
        return read_capped(f, limit, f"{what} {path}")


def too_large(name: str, limit: int) -> CharlmError:
    return CharlmError(f"cannot read {name}: it holds more than {limit / 2**20:g} MiB, charlm's "
                       "limit for it; give a smaller one")
