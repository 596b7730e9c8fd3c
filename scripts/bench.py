"""charlm's benchmarks, one harness: `decode`, `train`, `presets`, `prepare` and `serve` time their
variants in interleaved rounds (A B A B ...) and report them alike. `optimizers` compares AdamW
with Muon at equal wall time; `busy` times training beside other processes; `frontier`
gives the best val loss that 1, 5, 15 and 30 minutes buy.

    python scripts/bench.py SUBCOMMAND [--rounds N] [--tree REV_OR_DIR ...] [options]
    python scripts/bench.py SUBCOMMAND --help

On stdout, JSON lines: first the machine (CPU model, cores, torch threads and version, the CPU
capability, what computes bf16 natively, the GPU), the commit and the command; then one object
per variant per round (kind "round") and the facts of the run (kind "result"); last a summary of
each variant (kind "summary": min / median / max over the rounds, and `vs_<variant>`, the
paired ratios of its main metric against each variant before it, round by round). On stderr, the
same for a person: the machine line, a line per round, a table. `--tree` (repeated) compares
checkouts: each round runs the subcommand once per tree, in turn.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from benchlib.harness import Bench, report
from benchlib.trees import check_trees, tree_figures
from common import positive, run_script, summary

NAMES = ["decode", "train", "presets", "prepare", "serve", "optimizers", "busy", "frontier"]


def benches(argv: list[str]) -> list[Bench]:
    """The subcommand that `argv` names, or all of them (for --help). Importing only the one that
    runs lets `--tree` run an older charlm whose other subcommands import names it lacks."""
    chosen = [name for name in argv[:1] if name in NAMES] or NAMES
    return [importlib.import_module(f"benchlib.{name}").BENCH for name in chosen]


def parser(chosen: list[Bench]) -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(description=summary(__doc__), allow_abbrev=False)
    subs = top.add_subparsers(dest="bench", required=True, metavar="SUBCOMMAND")
    for bench in chosen:
        short = summary(bench.doc).removeprefix(f"`bench.py {bench.name}`: ")
        sub = subs.add_parser(bench.name, help=short[:1].upper() + short[1:],
                              description=bench.doc,
                              formatter_class=argparse.RawDescriptionHelpFormatter,
                              allow_abbrev=False)
        bench.add_arguments(sub)
        sub.add_argument("--rounds", type=positive(int), default=bench.rounds,
                         help=f"rounds of every variant, in turn (default {bench.rounds})")
        sub.add_argument("--tree", action="append", default=[], metavar="REV_OR_DIR",
                         help="run the rounds with this checkout's charlm (a directory or a "
                         "git revision; repeat it to compare trees, in turn each round)")
    return top


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    chosen = benches(argv)
    args = parser(chosen).parse_args(argv)
    bench = next(b for b in chosen if b.name == args.bench)
    figures = bench.figures(args)  # bad input is said here, before anything is printed
    check_trees(args.tree)
    if args.tree:
        figures = tree_figures(argv, args.tree, args.rounds)
    report(bench, figures, argv)


if __name__ == "__main__":
    run_script(main)
