"""How the command line reports what went wrong: the `error:` line, out-of-memory advice, SIGINT
and SIGTERM outside training, and a stdout that never raises on a character it cannot encode."""

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
    """Print an error line on stderr, its control characters escaped, once per machine under
    torchrun (`reports_errors`), not once per process."""
    if not reports_errors():
        return
    print(printable(line), file=sys.stderr)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupt(BaseException):
    """SIGINT or SIGTERM outside training (which stops on its own): raised where the command
    is, it unwinds it as an error would, each `finally` removing what it half-wrote; the
    process then exits 128 + the signal's number, as a shell counts it."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum

    def line(self) -> str:
        """What stderr shows: after a Ctrl-C on a line of its own (the terminal echoed ^C)."""
        if self.signum == signal.SIGINT:
            return "\ninterrupted"
        return f"interrupted by {signal.Signals(self.signum).name}"


def raise_interrupt(signum: int, frame: object) -> None:
    raise Interrupt(signum)


def out_of_memory(e: BaseException) -> bool:
    """An allocation that failed: CUDA's OutOfMemoryError, the CPU allocator's, a MemoryError."""
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in str(e))


def out_of_memory_line(e: BaseException, command: str) -> str:
    """The `error:` line for a failed allocation: its size and what `command` can make smaller."""
    tried = re.search(r"[Tt]ried to allocate (\d[\d.]* ?\w*)", str(e))
    return (f"error: out of memory{f' (tried to allocate {tried[1]})' if tried else ''}: "
            f"{OUT_OF_MEMORY_ADVICE.get(command, OUT_OF_MEMORY_ADVICE['train'])}")


def tolerant_stdout() -> None:
    """A closed stdout (`>&-`) goes to /dev/null, and one that cannot encode every character (a
    Latin-1 terminal) writes the others as escapes, as stderr does, not a traceback."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's)
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        sys.stdout.reconfigure(errors="backslashreplace")
