"""How the command line reports what went wrong: one `error:` line (once per machine under
torchrun), out-of-memory advice for each command, SIGINT and SIGTERM outside training, and a
stdout that never raises on a character its encoding lacks."""

import codecs
import io
import os
import re
import signal
import sys

from charlm.core.errors import printable
from charlm.core.ranks import reports_errors

OUT_OF_MEMORY_ADVICE = {  # what each command can make smaller
    "train": "make the model (model.n_layer, model.n_embd), train.batch_size or model.block_size "
             "smaller",
    "sample": "use a smaller --num-samples or --beams, or free memory on the device",
    "eval": "score a shorter text (split the file), free memory on the device, or score on "
            "another --device",
}


def writes_unicode(stream: object) -> bool:
    """Whether a text stream's encoding is a UTF one, which can write every character."""
    return codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name.startswith("utf")


def report(line: str) -> None:
    """Print an error line on stderr, its control characters escaped (`printable`: a newline or
    an escape sequence in a path stays on the line, as text); under torchrun only on the process
    that reports errors for its machine (`charlm.core.ranks.reports_errors`), so one line shows,
    not one per process."""
    if not reports_errors():
        return
    print(printable(line), file=sys.stderr)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupt(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM outside training, which saves and stops on its own
    (`faults`). Raised where the command is, it unwinds it as an error would (each `finally`
    and `except BaseException` removes what it had half-written); the process then exits with
    `exit_code`, 128 + the signal's number as a shell counts it: 130 or 143."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum

    def line(self) -> str:
        """What stderr shows: after a Ctrl-C, on a line of its own (the terminal echoed ^C)."""
        if self.signum == signal.SIGINT:
            return "\ninterrupted"
        return f"interrupted by {signal.Signals(self.signum).name}"


def raise_interrupt(signum: int, frame: object) -> None:
    raise Interrupt(signum)


def out_of_memory(e: BaseException) -> bool:
    """An allocation that failed: CUDA's OutOfMemoryError, the CPU allocator's error, or
    Python's MemoryError (a text too large to hold)."""
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in str(e))


def out_of_memory_line(e: BaseException, command: str) -> str:
    """The one `error:` line for an allocation of `command` that failed, with what it tried to
    allocate and what to make smaller."""
    tried = re.search(r"[Tt]ried to allocate (\d[\d.]* ?\w*)", str(e))
    return (f"error: out of memory{f' (tried to allocate {tried[1]})' if tried else ''}: "
            f"{OUT_OF_MEMORY_ADVICE.get(command, OUT_OF_MEMORY_ADVICE['train'])}")


def tolerant_stdout() -> None:
    """Make stdout safe to print to: a closed one (`>&-`) goes nowhere, as >/dev/null would,
    and one that cannot encode every character (PYTHONIOENCODING=ascii, a Latin-1 terminal)
    shows the others as escapes, as Python's stderr does, instead of a traceback mid-stream."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's)
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        sys.stdout.reconfigure(errors="backslashreplace")
