"""`CharlmError`, which the CLI turns into one `error: what, where, what to do` line and exit
code 2, helpers that put an exception, a count, a value or a near name in a message, `warn`."""

import difflib
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

# What a terminal acts on instead of showing: C0 controls (newline, ESC, ...), DEL, C1 controls
# and the Unicode line and paragraph separators.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class CharlmError(Exception):
    """Bad input or an impossible request, reported to the user without a traceback."""


class Setting(str):
    """A setting's name inside a `SettingError`'s message: the Python API's keyword (`top_k`)
    or a config key (`train.device`), which the CLI says as its flag (`--top-k`)."""


class SettingError(CharlmError):
    """Bad values of settings: the message in `parts`, its `Setting` parts the names, which the
    CLI's error line renames (`charlm.cli.app`)."""

    def __init__(self, *parts: str):
        super().__init__("".join(parts))
        self.parts = parts

    def calling(self, rename: Callable[[str], str]) -> str:
        """The message with each setting called rename(its name)."""
        return "".join(rename(p) if isinstance(p, Setting) else p for p in self.parts)


def first_line(e: BaseException) -> str:
    """`Type: first line of the message` of a library's exception, for one `warning:` line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def shown(value: Any, limit: int = 80) -> str:
    """repr(value), cut to about `limit` characters: an error line stays one line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def suggest(name: str, valid: Iterable[str]) -> str:
    """The end of an unknown name's message: the nearest valid name, else all of them."""
    valid = list(valid)
    close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.5)
    if close:
        return f", did you mean '{close[0]}'?"
    return f"; valid names are: {', '.join(valid)}"


def characters(n: int) -> str:
    return f"{n:,} character{'' if n == 1 else 's'}"


def one_line(e: BaseException | str, limit: int = 300) -> str:
    """The whole message of `e` on one line (torch's span several), cut to `limit`."""
    return " ".join(str(e).split())[:limit]


def warn(message: str) -> None:
    """Print one `warning: MESSAGE` line on stderr, `printable` as the `error:` line is."""
    print(f"warning: {printable(message)}", file=sys.stderr)


def printable(text: str) -> str:
    """`text` with each control character written as an escape (`\\n`, `\\x1b`), so a path in a
    message can neither break its one line nor act on the terminal."""
    return _CONTROLS.sub(lambda m: repr(m.group())[1:-1], text)  # as Python writes it
