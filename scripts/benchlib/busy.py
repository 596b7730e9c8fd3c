"""`bench.py busy`: `charlm train` on a busy CPU, timed from launch to exit (start-up and
evaluations included), for each config (the built-in defaults and the CPU presets unless named)
alone and beside other processes (--beside): `loop1` / `loop2`, one or two plain Python busy
loops; `train`, a second `charlm train` of the same config with the same threads setting.

Variants: `auto` (`train.threads: auto`, the default: the cores the others leave free) and
`all` (`train.threads` = this machine's usable cores: torch's own choice, what charlm did
before). Each run trains --steps steps. `tokens_per_s`: the tokens it trained over its wall
time; `vs_alone`: its wall time over the same variant's alone in the same round, to compare
with the target of issue 43 item 1: at most (k + 1) / 0.7 beside k busy processes."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchlib.harness import ROOT, Bench, charlm_env
from benchlib.presets import PRESETS
from charlm.config.loading import load_config
from charlm.runtime.profile import Machine

BESIDE = ("alone", "loop1", "loop2", "train")
LOOP = "while True: pass"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="*", metavar="CONFIG",
                        default=["defaults", *(str(ROOT / "configs" / name) for name in PRESETS)],
                        help="configs to train, or `defaults` (default: the built-in defaults "
                        "and the two CPU presets)")
    parser.add_argument("--steps", type=int, default=300, help="steps a run trains (300)")
    parser.add_argument("--beside", nargs="+", choices=BESIDE, default=list(BESIDE),
                        help="what runs beside it: alone loop1 loop2 train (default: all)")


def command(config: str | None, out: Path, steps: int, threads: str) -> list[str]:
    return [sys.executable, "-m", "charlm", "train", *([config] if config else []), "--out",
            str(out), "--set", f"train.max_iters={steps}", "--set", f"train.threads={threads}",
            "--set", "train.sample_chars=0"]


def timed_run(config: str | None, steps: int, threads: str, beside: str) -> dict:
    """One run beside `beside`, timed from its launch to its exit."""
    with tempfile.TemporaryDirectory() as tmp:
        others = []
        if beside.startswith("loop"):
            others = [subprocess.Popen([sys.executable, "-c", LOOP])
                      for _ in range(int(beside[-1]))]
        elif beside == "train":
            others = [subprocess.Popen(command(config, Path(tmp) / "other", 100 * steps, threads),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       env=charlm_env())]
        try:
            time.sleep(1.0 if others else 0.0)  # the others running before it starts
            t0 = time.perf_counter()
            done = subprocess.run(command(config, Path(tmp) / "run", steps, threads),
                                  capture_output=True, text=True, env=charlm_env())
            wall = time.perf_counter() - t0
        finally:
            for other in others:
                other.kill()
                other.wait()
        if done.returncode != 0:
            raise SystemExit(f"error: charlm train failed ({done.returncode}): "
                             f"{done.stderr.strip()[-500:]}")
        picked = re.search(r"^profile: \S+, (\d+) thread", done.stdout, re.M)
        return {"wall_s": round(wall, 2), "threads": int(picked[1]) if picked else None}


def measure(cases: list, args: argparse.Namespace, cores: int) -> Iterator[dict]:
    yield {"usable_cores": cores, "steps": args.steps}
    beside = sorted(args.beside, key=BESIDE.index)  # alone first: the others' ratios need it
    for r in range(1, args.rounds + 1):
        for path, config, tokens in cases:
            alone: dict[str, float] = {}
            for beside_ in beside:
                for variant, threads in (("auto", "auto"), ("all", str(cores))):
                    figure = timed_run(path, args.steps, threads, beside_)
                    if beside_ == "alone":
                        alone[variant] = figure["wall_s"]
                    yield {"config": config, "beside": beside_, "variant": variant, "round": r,
                           **figure, "tokens_per_s": round(tokens / figure["wall_s"]),
                           "vs_alone": round(figure["wall_s"] / alone[variant], 2)
                           if variant in alone else None}


def figures(args: argparse.Namespace) -> Iterator[dict]:
    """The figures of `args`: every config read now (a bad one is one error line before any
    run), the runs made as iterated."""
    cases = []
    for config in args.configs:
        path = None if config == "defaults" else config
        cfg = load_config(path)
        tokens = (args.steps * cfg.train.batch_size * cfg.train.grad_accum
                  * cfg.model.block_size)
        cases.append((path, "defaults" if path is None else Path(config).name, tokens))
    return measure(cases, args, Machine().cores())


BENCH = Bench("busy", __doc__, add_arguments, figures, case=("config", "beside"),
              metric="wall_s", metrics=("tokens_per_s", "vs_alone"), rounds=1)
