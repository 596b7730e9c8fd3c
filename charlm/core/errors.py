"""The one exception type that means "the user gave us something we cannot use", and the
helpers that put an exception or a count into a message.

The CLI turns a `CharlmError` into a single `error: ...` line on stderr and exit code 2 (see
`charlm.cli.reporting`). Its message follows the house pattern: what is wrong, where, and what
to do about it.
"""



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
