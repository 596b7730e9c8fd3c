"""`bench.py frontier`: the val loss on tiny-shakespeare (or `--text`, one file: the last tenth
held out by both) that each of --times buys from launch (default 1m 5m 15m 30m), for the model
sized to the budget and its peers.

Variants (`--variants`, default all): `sized`, `charlm train data/tinyshakespeare.txt --time T`;
each CPU preset given the same --time; `nanoGPT` (with --nanogpt DIR), its CPU recipe (as
`bench.py presets` runs it) with max_iters and lr_decay_iters set so that it ends by T: its step
time is measured first, over the later half of one 300-step run, and its steps are those that
fit T less 5 s of start-up, each counted 1.07 times for its evaluations, rounded down to a
multiple of its 250-step eval interval so that its last step is evaluated (and can be kept).
`within` says whether a run ended by its budget plus 5 percent or 10 s (issue 43's deadline).
`--set KEY=VALUE` goes to every charlm run (a seed, or a rung's keys to try a sizing rule's
other pick: the keys given win over the pick). Issue 43's targets for `sized`: 1.50 at 5m,
1.47 at 15m, 1.44 at 30m.

`full_val`, the figure to compare, is the loss of the model each run kept over the whole val split
(the same last 10 % of the text for both), in windows of block_size end to end. `best_val`, the
lowest eval during the run, favours nanoGPT: its evals score fresh random windows each time, and
the least of some 50 noisy estimates sits below the model's loss; charlm's score the same
windows each time."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from benchlib.harness import ROOT, Bench
from benchlib.loss import time_to_loss
from benchlib.presets import PRESETS, TEXT, run_nanogpt
from charlm.core.durations import duration_seconds
from charlm.core.errors import CharlmError

TIMES = ("1m", "5m", "15m", "30m")
TARGETS = {300.0: 1.50, 900.0: 1.47, 1800.0: 1.44}
VARIANTS = ("sized", *(Path(name).stem for name in PRESETS), "nanoGPT")
START_S, EVAL_SHARE = 5.0, 1.07  # nanoGPT's start-up, and its evals' share of its steps
NANOGPT_MODEL = "4 x 128, block 64"  # its CPU recipe's (presets.RECIPE)
EVAL_EVERY = 250  # nanoGPT's eval_interval for shakespeare_char: its steps are a multiple


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--times", nargs="+", default=list(TIMES), metavar="DURATION",
                        help="the budgets (default: 1m 5m 15m 30m)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="what to train (default: all; nanoGPT needs --nanogpt)")
    parser.add_argument("--nanogpt", type=Path, metavar="DIR",
                        help="a clone of karpathy/nanoGPT, to run its recipe in the same time")
    parser.add_argument("--text", type=Path, default=TEXT, metavar="FILE",
                        help="the text to train on (default: tiny-shakespeare; the targets are "
                        "its own)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a config key for every charlm run")


def figures(args: argparse.Namespace) -> Iterator[dict]:
    """The figures of `args`: the budgets and the clone checked now, the runs made as
    iterated."""
    times = [duration_seconds(t, "--times") for t in args.times]
    if "nanoGPT" in args.variants and not (args.nanogpt and (args.nanogpt / "train.py").is_file()):
        raise CharlmError("the nanoGPT variant needs --nanogpt DIR, a clone of karpathy/nanoGPT")
    return measure(times, args)


def measure(times: list[float], args: argparse.Namespace) -> Iterator[dict]:
    nanogpt_step_s: list[float] = []  # measured once, at the first nanoGPT run
    for r in range(1, args.rounds + 1):
        for seconds in times:
            for variant in args.variants:
                if variant == "nanoGPT":
                    if not nanogpt_step_s:
                        nanogpt_step_s.append(
                            run_nanogpt(args.nanogpt, iters=300, text=args.text)["step_s"])
                    fit = int((seconds - START_S) / (nanogpt_step_s[0] * EVAL_SHARE))
                    iters = max(EVAL_EVERY, fit // EVAL_EVERY * EVAL_EVERY)
                    result = {**run_nanogpt(args.nanogpt, iters, score=True, text=args.text),
                              "steps": iters, "model": NANOGPT_MODEL}
                else:
                    result = run_charlm(None if variant == "sized" else
                                        str(ROOT / "configs" / f"{variant}.yaml"), seconds,
                                        args.text, args.overrides)
                wall = result["total_wall_s"]
                yield {"time": f"{seconds:g}s", "variant": variant, "round": r,
                       "model": result["model"],
                       "full_val": result["full_val"], "best_val": result["best_val"],
                       "final_val": result["final_val"],
                       "steps": result["steps"], "total_wall_s": wall,
                       "within": wall <= seconds + max(0.05 * seconds, 10.0),
                       "target": TARGETS.get(seconds)
                       if variant == "sized" and args.text == TEXT else None}


def run_charlm(config: str | None, seconds: float, text: Path, overrides: list[str]) -> dict:
    """`charlm train [CONFIG] TEXT --time SECONDS --set ...` to its end: best and last val
    loss, the kept model's on the whole val split, steps, wall time from launch, the model."""
    # target 0: never reached, so the run goes to the end of its budget
    keys = [f"data.path={text}", f"train.max_time={seconds}", *overrides]
    run = time_to_loss(config, keys, 0.0, stop_at_target=False, max_seconds=2 * seconds + 60,
                       score=True)
    vals = [e["val_loss"] for e in run["curve"] if e["val_loss"] is not None]
    return {"best_val": min(vals) if vals else None, "final_val": run["final_val"],
            "full_val": run["full_val"], "model": run["model"],
            "total_wall_s": run["total_wall_s"],
            "steps": run["curve"][-1]["step"] if run["curve"] else None}


BENCH = Bench("frontier", __doc__, add_arguments, figures, case=("time",), metric="full_val",
              metrics=("best_val", "final_val", "steps", "total_wall_s"), rounds=1)
