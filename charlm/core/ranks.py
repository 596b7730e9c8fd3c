"""Which process of a torchrun world this is, read from its environment (no torch): rank 0
speaks for the run, local rank 0 reports each machine's errors."""

from __future__ import annotations

import os


def torchrun_place() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) when launched by torchrun, else None."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    env = os.environ
    return int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])), int(env["WORLD_SIZE"])


def is_main_process() -> bool:
    """False on the ranks of a torchrun world other than 0 (they stay quiet)."""
    place = torchrun_place()
    return place is None or place[0] == 0


def reports_errors() -> bool:
    """Whether this process prints the `error:` line of bad input: outside torchrun, or on local
    rank 0, as the ranks fail alike and each machine shows it once."""
    place = torchrun_place()
    return place is None or place[1] == 0
