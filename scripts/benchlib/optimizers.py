"""`bench.py optimizers`: AdamW against Muon (`optim.name`) at equal wall time: each config
trains `charlm train --time T` once with each optimizer in every round, round r with
`train.seed` = the config's seed + r - 1, and reports its best val loss; `vs_adamw` is Muon's
best val over AdamW's of the same seed. Configs: the CPU presets and the built-in defaults
(`defaults`) unless named. --set changes every run alike (e.g. `optim.muon_lr=0.01`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from benchlib.harness import ROOT, Bench
from benchlib.loss import time_to_loss
from benchlib.presets import PRESETS
from charlm.config.loading import load_config
from charlm.core.durations import duration_seconds

OPTIMIZERS = ("adamw", "muon")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="*", metavar="CONFIG",
                        default=[*(str(ROOT / "configs" / name) for name in PRESETS), "defaults"],
                        help="configs to train, or `defaults` (default: the two CPU presets and "
                        "the built-in defaults)")
    parser.add_argument("--time", default="60s", metavar="DURATION",
                        help="each run's train.max_time: `90`, `30s`, `5m` (default 60s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a config override for every run")


def figures(args: argparse.Namespace) -> Iterator[dict]:
    """The figures of `args`: every config and override checked now, with both optimizers; the
    runs made as iterated."""
    seconds = duration_seconds(args.time, "--time")
    runs = []
    for config in args.configs:
        path = None if config == "defaults" else config
        for name in OPTIMIZERS:
            cfg = load_config(path, [*args.overrides, f"optim.name={name}"])
        runs.append((path, "defaults" if path is None else Path(config).name, cfg.train.seed))
    return measure(runs, seconds, args)


def measure(runs: list, seconds: float, args: argparse.Namespace) -> Iterator[dict]:
    for r in range(1, args.rounds + 1):
        for path, config, seed in runs:
            for name in OPTIMIZERS:
                overrides = [*args.overrides, f"optim.name={name}", f"train.max_time={seconds}",
                             f"train.seed={seed + r - 1}"]
                # target 0: never reached, so the run goes to the end of its time budget
                result = time_to_loss(path, overrides, 0.0, stop_at_target=False,
                                      max_seconds=3 * seconds + 120)
                vals = [e["val_loss"] for e in result["curve"] if e["val_loss"] is not None]
                yield {"config": config, "variant": name, "round": r, "seed": seed + r - 1,
                       "best_val": min(vals) if vals else None,
                       "final_val": result["final_val"],
                       "steps": result["curve"][-1]["step"] if result["curve"] else None,
                       "total_wall_s": result["total_wall_s"],
                       "stopped_at_max_seconds": result["stopped_at_max_seconds"]}


BENCH = Bench("optimizers", __doc__, add_arguments, figures, case=("config",),
              metric="best_val", metrics=("final_val", "steps", "total_wall_s"), rounds=3)
