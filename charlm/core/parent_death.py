"""The parent-death signal (Linux's PR_SET_PDEATHSIG) that `charlm tune` asks for its trials.
The kernel sends it each time the process passes to a new parent (each live thread of a dying
tuner, then init): one request, however many times it comes."""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG, PR_GET_PDEATHSIG = 1, 2  # from <linux/prctl.h>

# libc's prctl, looked up once here: a forked child calls it without loading anything. macOS has
# no parent-death signal: a killed tuner's trials train on.
PRCTL: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError, AttributeError):
        PRCTL = ctypes.CDLL(None, use_errno=True).prctl


def parent_death_signal() -> int:
    """The signal this process gets when its parent dies; 0 for none (or off Linux)."""
    if PRCTL is None:
        return 0
    signum = ctypes.c_int(0)
    if PRCTL(PR_GET_PDEATHSIG, ctypes.byref(signum)) != 0:
        return 0
    return signum.value
