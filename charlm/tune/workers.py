"""What the tuner's workers need around their trials: a database's named lock, repeated configs
for seeds, which GPU each worker gets, and whether a trial's run dir is in use."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.core.files import locked
from charlm.tune.space import lookup

# A database's named lock, held by one session at a time: (take it, waiting; give it back).
# MySQL's GET_LOCK waits a year: MariaDB takes no lock (NULL) for its "forever", -1.
MYSQL_LOCK = ("SELECT GET_LOCK('charlm_tune', 31536000)", "SELECT RELEASE_LOCK('charlm_tune')")


DATABASE_LOCKS = {
    "postgresql": ("SELECT pg_advisory_lock(4242)", "SELECT pg_advisory_unlock(4242)"),
    "mysql": MYSQL_LOCK, "mariadb": MYSQL_LOCK,
}


@contextlib.contextmanager
def database_lock(engine: Any) -> Iterator[None]:
    """Hold the database's named lock (DATABASE_LOCKS) on a connection of its own, so that one
    tuner at a time, on any machine, does what it guards; no engine or no such lock: nothing."""
    sql = None if engine is None else DATABASE_LOCKS.get(engine.dialect.name)
    if sql is None:
        yield
        return
    from sqlalchemy import text

    with engine.connect() as conn:
        conn.execute(text(sql[0]))
        try:
            yield
        finally:
            conn.execute(text(sql[1]))


def repeated(cfg: RunConfig, repeats: int) -> list[RunConfig]:
    """A trial's runs: its config alone, or `repeats` copies with train.seed, seed + 1, ...,
    each in a `seed-N` dir of the trial's run dir."""
    if repeats == 1:
        return [cfg]
    runs = []
    for seed in range(cfg.train.seed, cfg.train.seed + repeats):
        run = copy.deepcopy(cfg)
        run.train.seed, run.train.out_dir = seed, str(Path(cfg.train.out_dir) / f"seed-{seed}")
        runs.append(run)
    return runs


def saved(run_dir: Path) -> bool:
    """Whether a trial's run dir holds a last.pt to resume from (one of its seeds' will do)."""
    return (run_dir / "last.pt").is_file() or any(run_dir.glob("seed-*/last.pt"))


def cuda_slots(base: dict[str, Any], workers: int) -> list[str]:
    """The GPU of each worker slot, when trials run on CUDA GPUs (one each); else []."""
    device = lookup(base, "train.device")
    if workers < 2 or device not in ("auto", "cuda"):
        return []
    import torch  # only for several workers on CUDA: the tuner's own process never pays it

    if not torch.cuda.is_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if len(gpus) < workers:
        raise CharlmError(f"--workers {workers} runs one trial per GPU, and this machine has "
                          f"{len(gpus)}; give --workers {len(gpus)} or fewer")
    return gpus[:workers]


def in_use(run_dir: Path) -> bool:
    """Whether a `charlm train` holds the lock on a trial's run dir, or on one of its seeds' (the
    flock of `charlm.training.run_dir.run_lock`, which goes with its process)."""
    return any(locked(path) for path in (run_dir, *run_dir.glob("seed-*")))
