"""One trial of `charlm tune`: a child `charlm train` process in its own run dir, followed through
its metrics.jsonl, stopped with one SIGTERM when the pruner (or the user) says so, and what its
ending means for the study (`Outcome`).

A child runs in its own session, so a Ctrl-C at the terminal reaches the tuner alone, which then
sends each child exactly one SIGTERM: it finishes its step, saves last.pt and exits 143.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_S = 0.2  # how often the tuner looks at a running trial
DIVERGED = "non-finite loss or gradient norm"  # in the error line of a run that diverged
LOG = "train.log"  # the child's stdout and stderr, in its run dir


@dataclass
class Stop:
    """The user's requests: the first Ctrl-C / SIGTERM stops the study (each child saves and
    exits), a second one aborts the children at once."""

    requested: threading.Event
    aborted: threading.Event


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
    """The events of a metrics.jsonl that a running process appends to: each complete line once.
    A file that shrinks (a resumed run cuts back its log) is read again from the start."""

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


def run_trial(cmd: list[str], run_dir: Path, env: dict[str, str], objective_key: str,
              report: Callable[[dict[str, Any]], bool], stop: Stop) -> Outcome:
    """Run `cmd` (a `charlm train` into `run_dir`) to its end. `report(eval_event)` says whether
    to prune; `stop` carries the user's requests to stop the study."""
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(run_dir / LOG, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    follower = Follower(run_dir / "metrics.jsonl")
    sent: str | None = None  # why the child was sent its SIGTERM: pruned / interrupted
    last: dict[str, Any] | None = None
    try:
        while True:
            code = proc.poll()
            for event in follower.events():
                if event.get("event") == "eval":
                    last = event
                    if report(event) and sent is None and code is None:
                        sent = terminate(proc, "pruned")
            if code is not None:
                break
            if stop.requested.is_set() and sent is None:
                sent = terminate(proc, "interrupted")
            if stop.aborted.is_set():  # a second Ctrl-C: no waiting for a save
                proc.kill()
            time.sleep(POLL_S)
    except BaseException:  # the tuner itself is going down: take the child with it
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise
    seconds = time.monotonic() - start
    step = None if last is None else last.get("step")
    value = None if last is None else last.get(objective_key)
    if code == 0:
        if value is None:
            return Outcome("failed", None, step, seconds, f"no finite {objective_key} logged")
        return Outcome("complete", float(value), step, seconds)
    if sent is not None:
        return Outcome(sent, value, step, seconds)
    error = last_error(run_dir / LOG) or f"exit code {code}"
    return Outcome("diverged" if DIVERGED in error else "failed", value, step, seconds, error)


def terminate(proc: subprocess.Popen[bytes], why: str) -> str:
    """One SIGTERM: the child saves last.pt and exits 143 (a second one would abort it)."""
    proc.send_signal(signal.SIGTERM)
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
