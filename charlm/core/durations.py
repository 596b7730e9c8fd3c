"""Durations as a person writes them (`90`, `30s`, `5m`, `1h30m`) and as charlm prints them."""

from __future__ import annotations

import math
import re

from charlm.core.errors import CharlmError

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
LONGEST = 365 * 24 * 3600.0  # a year: a longer budget is a typo, not a plan
PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smh])")


def duration_seconds(value: float | str, key: str = "train.max_time") -> float:
    """Seconds from a number or a text like 90, 30s, 5m, 1h30m, 1.5h; at most `LONGEST`."""
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = PART.findall(text)
            if not parts or PART.sub("", text).strip():
                raise CharlmError(
                    f"invalid config value {key}: {value!r} is not a duration; give seconds or "
                    "a number with s, m or h (90, 30s, 5m, 2h, 1h30m)") from None
            seconds = sum(float(number) * UNITS[unit] for number, unit in parts)
    else:
        seconds = float(value)
    if not (math.isfinite(seconds) and seconds > 0):
        raise CharlmError(f"invalid config value {key}: must be a positive duration, got "
                          f"{value!r}")
    if seconds > LONGEST:
        raise CharlmError(f"invalid config value {key}: must be at most a year "
                          f"({LONGEST / 3600:g}h), got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """90.0 -> '1m30s'; under a minute with one decimal: '12.5s'."""
    if seconds < 60:
        return f"{max(seconds, 0):.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours}h{minutes:02d}m" if hours else f"{minutes}m") + f"{secs:02d}s"
