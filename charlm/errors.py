"""The one exception type that means "the user gave us something we cannot use".

The CLI turns a `CharlmError` into a single `error: ...` line on stderr and exit code 2. Its
message follows the house pattern: what is wrong, where, and what to do about it. Also here: how
the CLI reports errors (one line, once per machine under torchrun) and the advice it gives.
"""

import codecs
import io
import os
import re
import sys


class CharlmError(Exception):
    """Bad input or an impossible request, reported to the user without a traceback."""


def first_line(e: BaseException) -> str:
    """`Type: first line of the message` of an exception from a library (e.g. a torch.compile
    backend), short enough for one `warning:` line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def characters(n: int) -> str:
    """'1 character', '2 characters': a count of characters in a message."""
    return f"{n:,} character{'' if n == 1 else 's'}"


def one_line(e: BaseException | str, limit: int = 300) -> str:
    """The whole message of `e` on one line (torch's state_dict errors span several), cut to
    `limit` characters."""
    return " ".join(str(e).split())[:limit]


OUT_OF_MEMORY_ADVICE = {  # what each command can make smaller
    "train": "make the model (model.n_layer, model.n_embd), train.batch_size or model.block_size "
             "smaller",
    "sample": "use a smaller --num-samples or --beams, or free memory on the device",
    "eval": "free memory on the device, or score on another --device",
}


def writes_unicode(stream: object) -> bool:
    """Whether a text stream's encoding is a UTF one, which can write every character."""
    return codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name.startswith("utf")


def report(line: str) -> None:
    """Print an error line on stderr; under torchrun only on the process that reports errors
    for its machine (`charlm.device.reports_errors`), so one line shows, not one per process."""
    if "LOCAL_RANK" in os.environ:  # only under torchrun: charlm.device imports torch
        from charlm.device import reports_errors

        if not reports_errors():
            return
    print(line, file=sys.stderr)


class Interrupt(BaseException):
    """Ctrl-C (SIGINT) outside training, which saves and stops on its own (`faults`)."""


def raise_interrupt(signum: int, frame: object) -> None:
    raise Interrupt


def out_of_memory(e: RuntimeError) -> bool:
    """An allocation that failed: CUDA's OutOfMemoryError, or the CPU allocator's error."""
    return type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(e)


def out_of_memory_line(e: RuntimeError, command: str) -> str:
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
