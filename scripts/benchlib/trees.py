"""`--tree`: a subcommand's rounds over other checkouts of charlm, for a before/after comparison.

Each round runs the subcommand once per tree, in the order given (A B A B ...), as a child
`python scripts/bench.py ... --rounds 1` whose PYTHONPATH puts the tree's `charlm` first: the
measuring code is this checkout's, only the library differs. A tree is a directory (a checkout,
a `git worktree`) or a revision of this repository, exported with `git archive` into a temporary
directory that is removed at the end. The children's rounds come back as this run's, their
variants named `TREE:VARIANT`; their results (facts of the run) come from the first round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from benchlib.harness import ROOT
from charlm.core.errors import CharlmError

BENCH_PY = ROOT / "scripts" / "bench.py"
Child = Callable[[Path, list[str]], list[dict]]


def check_trees(trees: list[str], root: Path = ROOT) -> None:
    """Refuse a tree that is neither a directory nor a commit of `root`, before any round."""
    for tree in trees:
        if Path(tree).is_dir():
            continue
        found = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "--quiet",
                                f"{tree}^{{commit}}"], capture_output=True)
        if found.returncode != 0:
            raise CharlmError(f"--tree {tree}: neither a directory nor a commit of {root}; "
                              "give a checkout's directory or a git revision")


@contextmanager
def checkouts(trees: list[str], root: Path = ROOT) -> Iterator[dict[str, Path]]:
    """Each tree's directory: a directory as is, a revision exported into a temporary one."""
    with tempfile.TemporaryDirectory(prefix="bench-trees-") as tmp:
        paths = {}
        for i, tree in enumerate(trees):
            if Path(tree).is_dir():
                paths[tree] = Path(tree).resolve()
                continue
            dest = Path(tmp) / f"tree-{i}"
            dest.mkdir()
            archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", tree],
                                     capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
            paths[tree] = dest
        yield paths


def child_argv(argv: list[str]) -> list[str]:
    """The subcommand's arguments for one tree's child: without --tree, and one round."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--tree":
            skip = True
        elif not arg.startswith("--tree="):
            out.append(arg)
    return [*out, "--rounds", "1"]


def run_child(tree: Path, argv: list[str]) -> list[dict]:
    """The JSON lines of `bench.py ARGV` run with `tree`'s charlm."""
    path = [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]
    done = subprocess.run([sys.executable, str(BENCH_PY), *argv], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"error: the run with the tree {tree} failed with exit code "
                         f"{done.returncode}: {last}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def tree_figures(argv: list[str], trees: list[str], rounds: int,
                 child: Child = run_child) -> Iterator[dict]:
    """The figures of `rounds` rounds of the subcommand `argv`, each round over every tree."""
    with checkouts(trees) as paths:
        for r in range(1, rounds + 1):
            for label, path in paths.items():
                for record in child(path, child_argv(argv)):
                    kind = record.pop("kind")
                    record.pop("bench", None)
                    name = f"{label}:{record.get('variant', '')}"
                    if kind == "round":
                        yield {**record, "variant": name, "round": r}
                    elif kind == "result" and r == 1:
                        yield {**record, "variant": name}
