"""What the benchmark scripts share: their --help description, argparse's positive (or
non-negative) counts, and bad input reported as the charlm CLI reports it (one `error:` line,
exit code 2, no traceback);
Ctrl-C and SIGTERM end a script with 130 and 143, running its cleanup (`finally`) on the way."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from typing import Any

from charlm.errors import CharlmError


def summary(doc: str | None) -> str:
    """A script's --help description: the first paragraph of its docstring (its first line alone
    can stop mid-sentence)."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


def positive(kind: type, zero: bool = False) -> Callable[[str], Any]:
    """An argparse type: a number of `kind` greater than 0 (at least 0 with `zero`)."""
    def parse(text: str) -> Any:
        value = kind(text)
        if not (value >= 0 if zero else value > 0):
            bound = "at least 0" if zero else "greater than 0"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value
    return parse


def terminated(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through `finally`, unlike the default SIGTERM


def run_script(main: Callable[[], None]) -> None:
    """Run a script's `main`; a CharlmError (a missing config, a bad --set) ends in one line, and
    Ctrl-C (or SIGTERM) stops it without a traceback, after its `finally` blocks have run."""
    signal.signal(signal.SIGTERM, terminated)
    try:
        main()
    except CharlmError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)
