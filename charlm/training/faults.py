"""Faults a training run survives: stop signals (`StopSignals`: the first one stops the run after
its step, with `last.pt` saved) and non-finite steps (`BadSteps`: their updates are skipped, and a
run that keeps producing them is stopped)."""

from __future__ import annotations

import os
import shlex
import signal
import threading
from pathlib import Path
from typing import Any

import torch

from charlm.core.errors import CharlmError
from charlm.core.parent_death import parent_death_signal


class Interrupted(KeyboardInterrupt):
    """Training stopped on a signal after saving `last.pt`; the CLI exits with `exit_code`."""

    def __init__(self, run_dir: Path, step: int, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name} at step {step}: saved "
                         f"{run_dir / 'last.pt'}; continue with "
                         f"`charlm train --out {shlex.quote(str(run_dir))} --resume`")
        self.exit_code = 128 + signum  # the shell convention: 130 for SIGINT, 143 for SIGTERM


class Aborted(KeyboardInterrupt):
    """A second signal ended training at once, without saving (what it said is on stderr)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


STOPS = (signal.SIGINT, signal.SIGTERM)
ABORT_GRACE_S = 2.0  # how long a second signal may wait for the main thread to take it


class StopSignals:
    """While active (in the main thread only), the first SIGINT / SIGTERM only sets `signum`;
    a second raises `Aborted`. `announce=False` keeps the first quiet (the DDP ranks but 0);
    `saved`: whether last.pt holds a save. A thread reads the wakeup fd the C handler writes, to
    announce the first signal at once and end the process when a long native call keeps the main
    thread from a second for ABORT_GRACE_S. The parent-death signal (a `charlm tune` trial's
    SIGTERM, maybe once per thread of the dying tuner) only asks to stop."""

    def __init__(self, announce: bool = True, saved: bool = False) -> None:
        self.signum: int | None = None
        self.announce = announce
        self.saved = saved
        self._previous: dict[int, Any] = {}
        self._aborting = threading.Event()
        self._wakeup: tuple[int, int, int] | None = None  # read end, write end, previous fd
        self._only_stops: set[int] = set()  # signals that never abort: the parent-death one

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._only_stops = {parent_death_signal()} & set(STOPS)
            for sig in STOPS:
                self._previous[sig] = signal.signal(sig, self._handle)
            read, write = os.pipe()
            os.set_blocking(write, False)
            self._wakeup = (read, write, signal.set_wakeup_fd(write, warn_on_full_buffer=False))
            threading.Thread(target=self._watch, args=(read,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            # None: the previous handler was not installed from Python; the default is closest.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()
        if self._wakeup is not None:
            read, write, previous = self._wakeup
            signal.set_wakeup_fd(previous)
            self._aborting.set()  # the watcher has nothing left to do
            os.close(write)  # its read ends
            self._wakeup = None

    def requested(self) -> bool:
        return self.signum is not None

    def _watch(self, read: int) -> None:
        seen = False
        try:
            while data := os.read(read, 64):  # every signal with a Python handler, not ours only
                stops = [sig for sig in data if sig in STOPS]
                if stops and not seen and self.announce:  # the handler may wait for the step
                    os.write(2, f"\n{signal.Signals(stops[0]).name}: finishing this step and "
                                "saving last.pt (press Ctrl-C again to abort without saving)\n"
                                .encode())
                aborts = [sig for sig in stops[0 if seen else 1:] if sig not in self._only_stops]
                seen = seen or bool(stops)
                if aborts and not self._aborting.wait(ABORT_GRACE_S):
                    self._say_aborted()
                    os._exit(128 + aborts[-1])
        finally:
            os.close(read)

    def _say_aborted(self) -> None:  # what a second signal says as it ends the run
        os.write(2, b"aborted: last.pt holds the last completed save\n" if self.saved else
                 b"aborted: no checkpoint yet\n")

    def _handle(self, signum: int, frame: object) -> None:
        # os.write, not print: a handler may run in the middle of another write to stderr.
        if self.signum is not None and signum not in self._only_stops:
            self._aborting.set()
            self._say_aborted()
            raise Aborted(signum)
        if self.signum is None:
            self.signum = signum


class BadSteps:
    """Counts steps with a non-finite loss or gradient norm on the device, so recording never
    waits for it; saved with the train state, so a streak goes on across a resume. `tripped_at`:
    the step at which `limit` bad steps in a row were first reached (0: never)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.streak = torch.zeros((), dtype=torch.int64, device=device)
        self.total = torch.zeros((), dtype=torch.int64, device=device)
        self.tripped_at = torch.zeros((), dtype=torch.int64, device=device)
        self.reported = 0  # `total` as of the last `check`, on the host

    def state_dict(self) -> dict[str, int]:
        """Waits for the device."""
        return {"skipped_steps": int(self.total), "bad_streak": int(self.streak)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total.fill_(state.get("skipped_steps", 0))  # 0: older checkpoints lack them
        self.streak.fill_(state.get("bad_streak", 0))
        self.tripped_at.zero_()
        self.reported = int(state.get("skipped_steps", 0))

    def record(self, ok: torch.Tensor, step: int, limit: int) -> None:
        bad = (~ok).long()
        self.streak = (self.streak + 1) * bad
        self.total += bad
        # >=: a run resumed with a limit below its saved streak stops at its next bad step
        first = (self.streak >= limit) & (self.tripped_at == 0)
        self.tripped_at = torch.where(first, step, self.tripped_at)

    def check(self, limit: int, last_pt: Path, saved_step: int | None) -> int:
        """Wait for the device once: how many updates were skipped since the last check, or a
        CharlmError once `limit` in a row were reached (`saved_step`: that of `last_pt`, if any)."""
        step = int(self.tripped_at)
        if step:
            kept, then = (("no checkpoint was written", "start over with --overwrite")
                          if saved_step is None else
                          (f"the last checkpoint {last_pt} (step {saved_step}) is intact",
                           "resume or start over"))
            raise CharlmError(
                f"training stopped: {limit} steps in a row, up to step {step}, had a "
                f"non-finite loss or gradient norm (their updates were skipped); {kept}; lower "
                f"optim.lr, raise optim.warmup_iters or check the data, then {then}")
        total = int(self.total)
        new, self.reported = total - self.reported, total
        return new
