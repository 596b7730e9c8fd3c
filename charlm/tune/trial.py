"""One trial of `charlm tune`: a child `charlm train` in its own run dir (one per seed when
trials repeat), followed through its metrics.jsonl, what its ending means (`Outcome`), and
whether its run dir has saved or is in use.

A child runs in its own session, so a Ctrl-C reaches the tuner alone, which sends each child one
SIGTERM: it saves last.pt and exits 143. On Linux the tuner's death sends it too (`die_with`)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from charlm.config.schema import RunConfig
from charlm.core.files import locked
from charlm.core.parent_death import PR_SET_PDEATHSIG, PRCTL

POLL_S = 0.2  # how often the tuner looks at a running trial
DIVERGED = "non-finite loss or gradient norm"  # in the error line of a run that diverged
NOTHING_LEFT = "--resume: nothing to train"  # in that of a resumed run that had already ended
LOG = "train.log"  # the child's stdout and stderr, in its run dir


@dataclass
class Stop:
    """The user's requests: the first Ctrl-C / SIGTERM stops the study (each child saves and
    exits), a second aborts the children. `signum`: the first signal's."""

    requested: threading.Event
    aborted: threading.Event
    signum: int | None = None


@contextlib.contextmanager
def stop_signals(stop: Stop) -> Iterator[None]:
    """`stop` made by SIGINT and SIGTERM while the block runs (each request said on stderr)."""

    def handle(signum: int, frame: object) -> None:
        if stop.requested.is_set():
            stop.aborted.set()
            os.write(2, b"aborting the running trials without saving\n")
            return
        stop.signum = signum
        stop.requested.set()
        os.write(2, f"\n{signal.Signals(signum).name}: each running trial saves last.pt and stops "
                    "(press Ctrl-C again to abort them)\n".encode())

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Outcome:
    """How a trial ended: complete, pruned, diverged (pruned with the value it had), failed
    (`error`: the child's last error line) or interrupted (by the user; resumable)."""

    state: str
    value: float | None = None
    step: int | None = None
    seconds: float = 0.0
    error: str | None = None


class Follower:
    """The events a running process appends to a metrics.jsonl, each complete line once; a file
    that shrinks (a resumed run cuts back its log) is read again from the start."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def events(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                if os.fstat(f.fileno()).st_size < self.offset:
                    self.offset, self.partial = 0, b""
                f.seek(self.offset)
                data = f.read()
        except OSError:  # not written yet
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        events = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events


def run_trial(runs: list[tuple[list[str], Path]], env: dict[str, str], objective_key: str,
              report: Callable[[dict[str, Any]], bool], stop: Stop) -> Outcome:
    """Run a trial's `charlm train`s (command, run dir) at once, to their end; `report` gets
    each eval `merge` gives and says whether to prune."""
    start = time.monotonic()
    children = [Child.start(cmd, run_dir, env) for cmd, run_dir in runs]
    sent: str | None = None  # why the children were sent their SIGTERM: pruned / interrupted
    merged: list[dict[str, Any]] = []  # the eval events every child has logged, merged
    try:
        while True:
            codes = [child.proc.poll() for child in children]
            for child in children:
                child.read()
            for event in merge(children, objective_key, merged):
                merged.append(event)
                if report(event) and sent is None:
                    sent = terminate(children, "pruned")
            if None not in codes:
                break
            if stop.requested.is_set() and sent is None:
                sent = terminate(children, "interrupted")
            if stop.aborted.is_set():  # a second Ctrl-C: no waiting for a save
                for child in children:
                    child.proc.kill()
            time.sleep(POLL_S)
    except BaseException:  # the tuner itself is going down: take the children with it
        for child in children:
            if child.proc.poll() is None:
                child.proc.kill()
            child.proc.wait()
        raise
    seconds = time.monotonic() - start
    step = merged[-1].get("step") if merged else None
    value = merged[-1].get(objective_key) if merged else None
    if all(map(finished, codes, children)):
        # each run's own last eval: runs with a time budget may end at different steps
        finals = [child.evals[max(child.evals)] if child.evals else {} for child in children]
        values = [final.get(objective_key) for final in finals]
        if None in values:
            return Outcome("failed", None, step, seconds, f"no finite {objective_key} logged")
        return Outcome("complete", statistics.fmean(map(float, values)),
                       max(final["step"] for final in finals), seconds)
    if sent is not None:
        return Outcome(sent, value, step, seconds)
    code, run_dir = next((c, child.run_dir) for c, child in zip(codes, children, strict=True)
                         if not finished(c, child))
    error = last_error(run_dir / LOG) or f"exit code {code}"
    return Outcome("diverged" if DIVERGED in error else "failed", value, step, seconds, error)


def finished(code: int | None, child: Child) -> bool:
    """Whether a child's run trained to its end: it exited 0, or `--resume` found nothing to
    train (a seed that finished before its tuner stopped, a spent time budget)."""
    return code == 0 or (code == 2 and NOTHING_LEFT in (last_error(child.run_dir / LOG) or ""))


def ended(run_dirs: list[Path], objective_key: str, last_step: int) -> Outcome | None:
    """Complete, with the mean of their final values, if every run of a resumed trial logged
    its final eval (at `last_step`) already: a killed tuner's trial that ended on its own."""
    finals = [([e for e in Follower(run_dir / "metrics.jsonl").events()
                if e.get("event") == "eval"] or [{}])[-1] for run_dir in run_dirs]
    if any(e.get("step") != last_step or e.get(objective_key) is None for e in finals):
        return None
    return Outcome("complete", statistics.fmean(float(e[objective_key]) for e in finals),
                   last_step)


@dataclass
class Child:
    """One `charlm train` of a trial and the eval events of its metrics.jsonl, by step."""

    proc: subprocess.Popen[bytes]
    run_dir: Path
    follower: Follower
    evals: dict[int, dict[str, Any]]

    @classmethod
    def start(cls, cmd: list[str], run_dir: Path, env: dict[str, str]) -> Child:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / LOG, "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=die_with(os.getpid()))
        return cls(proc, run_dir, Follower(run_dir / "metrics.jsonl"), {})

    def read(self) -> None:
        for event in self.follower.events():
            if event.get("event") == "eval" and isinstance(event.get("step"), int):
                self.evals[event["step"]] = event


def die_with(tuner: int) -> Callable[[], None] | None:
    """What a child runs between fork and exec (None off Linux): a SIGTERM when the thread that
    started it dies (its worker, or the whole tuner on a `kill -9`); a tuner already gone is no
    longer its parent, so the child exits at once."""
    if PRCTL is None:
        return None

    def call() -> None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != tuner:
            os._exit(128 + signal.SIGTERM)

    return call


def merge(children: list[Child], key: str, done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The evals after `done` that every child has logged: the first child's event with the
    mean of their `key` (None if one lacks it)."""
    after = done[-1]["step"] if done else -1
    steps = sorted(s for s in children[0].evals if s > after
                   and all(s in child.evals for child in children))
    merged = []
    for s in steps:
        values = [child.evals[s].get(key) for child in children]
        mean = None if None in values else statistics.fmean(map(float, values))
        merged.append({**children[0].evals[s], key: mean})
    return merged


def terminate(children: list[Child], why: str) -> str:
    """One SIGTERM to each running child (a second would abort it, unsaved)."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
    return why


def last_error(log: Path, tail: int = 8192) -> str | None:
    """The child's last `error:` line (else its last line) in the log, if any."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    lines = [line.strip() for line in lines if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [None])[-1]


def repeated(cfg: RunConfig, repeats: int) -> list[RunConfig]:
    """A trial's runs: its config alone, or `repeats` seeds of it, each in a `seed-N` dir."""
    if repeats == 1:
        return [cfg]
    runs = []
    for seed in range(cfg.train.seed, cfg.train.seed + repeats):
        run = copy.deepcopy(cfg)
        run.train.seed, run.train.out_dir = seed, str(Path(cfg.train.out_dir) / f"seed-{seed}")
        runs.append(run)
    return runs


def saved(run_dir: Path) -> bool:
    return (run_dir / "last.pt").is_file() or any(run_dir.glob("seed-*/last.pt"))


def in_use(run_dir: Path) -> bool:
    """Whether a `charlm train` holds the lock on a trial's run dir, or on one of its seeds' (the
    flock of `charlm.training.run_dir.run_lock`, which goes with its process)."""
    return any(locked(path) for path in (run_dir, *run_dir.glob("seed-*")))
