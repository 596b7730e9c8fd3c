"""The harness every `bench.py` subcommand runs under: its variants timed in interleaved rounds
(`interleave`), the figures written as JSON lines (the machine first, then one object per variant
per round, then a summary of each variant: min / median / max over the rounds and the paired
ratios against the variants before it) and a human-readable summary on stderr (`report`).

A subcommand is a `Bench`: its arguments and `figures(args)`, which checks its input when called
(so bad input is one `error:` line, before anything is printed) and returns an iterable of
figures. A figure is a dict: with a "round" and a "variant" it is one measurement, summarized;
without a round it is a fact of the run (the model's size, a check), written as it comes."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from common import machine_facts, machine_line

import charlm

ROOT = Path(__file__).resolve().parents[2]

Figures = Callable[[argparse.Namespace], Iterable[dict]]
Runner = Callable[[], dict]


@dataclass(frozen=True)
class Bench:
    """A subcommand: its name, its --help (`doc`, the module's docstring), its arguments, what
    it measures, the keys that name a case (a config, a dtype, a batch: variants are compared
    within a case), the metric whose ratios between variants the summary gives, and the other
    metrics it summarizes; `rounds`: the default of --rounds."""
    name: str
    doc: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    figures: Figures
    case: tuple[str, ...]
    metric: str
    metrics: tuple[str, ...] = ()
    rounds: int = 5


def interleave(runners: dict[str, Runner], rounds: int, warmup: int = 0) -> Iterator[dict]:
    """Each runner's figure in each of `rounds` rounds, after `warmup` unrecorded calls of each.
    A round calls every runner once, in the order given (A B A B ...), so a machine whose speed
    drifts, or a neighbour that comes and goes, falls on every variant alike."""
    for _ in range(warmup):
        for run in runners.values():
            run()
    for r in range(1, rounds + 1):
        for name, run in runners.items():
            yield {"variant": name, "round": r, **run()}


def stats(values: Iterable[float | None]) -> dict | None:
    """min, median and max of the values that are not None, and how many there were; None if
    none were."""
    xs = [v for v in values if v is not None]
    if not xs:
        return None
    return {"min": round(min(xs), 4), "median": round(statistics.median(xs), 4),
            "max": round(max(xs), 4), "n": len(xs)}


def paired_ratios(rows: list[dict], others: list[dict], metric: str) -> Iterator[float | None]:
    """`metric` of each of `rows` over that of the row of `others` from the same round: a ratio
    within a round, where the machine was alike for both."""
    by_round = {row["round"]: row.get(metric) for row in others}
    for row in rows:
        a, b = row.get(metric), by_round.get(row["round"])
        yield a / b if a is not None and b else None


def summaries(figures: list[dict], case: tuple[str, ...], metric: str,
              metrics: tuple[str, ...] = ()) -> list[dict]:
    """One summary per case and variant, in the order met: `stats` of each metric over the
    rounds, and `vs_<other>` for each variant met before it in the same case: `stats` of the
    paired ratios of `metric` (this variant's over the other's)."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for f in figures:
        key = tuple(f.get(k) for k in case)
        groups.setdefault(key, {}).setdefault(f["variant"], []).append(f)
    out = []
    for key, variants in groups.items():
        names = list(variants)
        for i, name in enumerate(names):
            rows = variants[name]
            summary = {**dict(zip(case, key, strict=True)), "variant": name, "rounds": len(rows)}
            for m in (metric, *metrics):
                summary[m] = stats(row.get(m) for row in rows)
            for other in names[:i]:
                summary[f"vs_{other}"] = stats(paired_ratios(rows, variants[other], metric))
            out.append(summary)
    return out


def number(x: float) -> str:
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def spread(s: dict | None, unit: str = "") -> str:
    """A summary's stats as "median (min-max)"."""
    if s is None:
        return "-"
    if s["n"] == 1:
        return f"{number(s['median'])}{unit}"
    return f"{number(s['median'])}{unit} ({number(s['min'])}-{number(s['max'])})"


def table(rows: list[dict], case: tuple[str, ...], metric: str) -> str:
    """The summaries as a markdown table: the case, the variant, the metric's median (min-max)
    and the paired ratios."""
    versus = list(dict.fromkeys(k for row in rows for k in row if k.startswith("vs_")))
    head = [*case, "variant", "rounds", f"{metric}, median (min-max)",
            *(k.replace("_", " ", 1) for k in versus)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [*(str(row[k]) for k in case), row["variant"], str(row["rounds"]),
                 spread(row[metric]), *(spread(row.get(k), "x") if k in row else ""
                                        for k in versus)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def commit(root: Path = ROOT) -> dict:
    """The checkout's commit, and whether tracked files differ from it (None outside git)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": sha, "dirty": None if sha is None or dirty is None else bool(dirty)}


def emit(record: dict, out: TextIO) -> None:
    out.write(json.dumps(record) + "\n")
    out.flush()


def report(bench: Bench, figures: Iterable[dict], argv: list[str], out: TextIO | None = None,
           err: TextIO | None = None) -> list[dict]:
    """Write a run's JSON lines on `out` (stdout) and its human-readable summary on `err`
    (stderr): the machine (with the commit and the command), each figure as it comes (kind
    "round" or "result"), then the summaries (kind "summary"), which are returned."""
    out, err = out or sys.stdout, err or sys.stderr
    facts = machine_facts()
    command = "python scripts/bench.py " + shlex.join(argv)
    emit({"kind": "machine", "bench": bench.name, "command": command, **commit(), **facts}, out)
    err.write(machine_line(facts) + "\n")
    rounds = []
    for figure in figures:
        if "round" in figure:
            rounds.append(figure)
            emit({"kind": "round", "bench": bench.name, **figure}, out)
            value = figure.get(bench.metric)
            where = " ".join(str(figure.get(k)) for k in (*bench.case, "variant"))
            shown = "-" if value is None else number(value)
            err.write(f"round {figure['round']}, {where}: {shown} {bench.metric}\n")
        else:
            emit({"kind": "result", "bench": bench.name, **figure}, out)
            err.write(" ".join(f"{k}={v}" for k, v in figure.items() if k != "curve") + "\n")
    rows = summaries(rounds, bench.case, bench.metric, bench.metrics)
    for row in rows:
        emit({"kind": "summary", "bench": bench.name, **row}, out)
    if rows:
        err.write("\n" + table(rows, bench.case, bench.metric) + "\n")
    err.flush()
    return rows


def charlm_env() -> dict[str, str]:
    """The environment for a child `python -m charlm`: this process's, with the directory of
    the charlm it imported first on PYTHONPATH, so the child runs the same code (this checkout,
    or a `--tree`)."""
    here = str(Path(charlm.__file__).resolve().parents[1])
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([here, *rest])}

