"""Running a `charlm tune` study: `Tuner` runs its trials, each a child `charlm train`
(`charlm.tune.trial`), counting and asking for them under a lock so that workers never start
more than asked, and queues interrupted trials again to resume them."""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from tqdm import tqdm

from charlm.config.loading import save_config
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError, first_line
from charlm.core.files import alive
from charlm.tune.report import trial_line
from charlm.tune.space import OBJECTIVES, lookup
from charlm.tune.study import StudyConfig, database_lock, make_pruner, make_sampler, make_storage
from charlm.tune.trial import Outcome, Stop, ended, in_use, repeated, run_trial, saved, stop_signals

BY_TOKENS = ("model.block_size", "train.batch_size", "train.grad_accum")  # change tokens a step


class Tuner:
    """Runs a study's trials, `workers` at a time, until its budget is spent or it is stopped."""

    def __init__(self, study_cfg: StudyConfig, workers: int, trials: int, timeout: float | None):
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.study_cfg, self.workers, self.trials = study_cfg, workers, trials
        self.timeout = timeout
        search = study_cfg.search
        self.key, direction = OBJECTIVES[search.setting("objective")]
        self.repeats = search.setting("repeats")
        self.storage = make_storage(study_cfg)
        self.study = optuna.create_study(
            storage=self.storage, study_name=study_cfg.study_name, direction=direction,
            pruner=make_pruner(search, study_cfg.base), load_if_exists=True)
        self.check_joined()
        seed, done = search.setting("seed"), len(self.study.get_trials(deepcopy=False))
        self.study.sampler = make_sampler(search, None if seed is None else seed + done, workers)
        self.stop = Stop(threading.Event(), threading.Event())
        self.start = time.monotonic()
        self.host = socket.gethostname()
        self.by_tokens = any(k in search.params for k in BY_TOKENS)
        self.gpus = cuda_slots(study_cfg.base, workers)
        self.bar: tqdm | None = None
        self.error: Exception | None = None  # what stopped a worker

    def check_joined(self) -> None:
        """A worker joins a study only if it searches the same space from the same config."""
        base = copy.deepcopy(self.study_cfg.base)  # where each machine keeps its files may differ
        del base["train"]["out_dir"], base["data"]["path"]
        mine = {"space": self.study_cfg.search.spec(), "config": base,
                "objective": self.study_cfg.search.setting("objective"), "repeats": self.repeats}
        theirs = self.study.user_attrs.get("charlm")
        if theirs is None:
            self.study.set_user_attr("charlm", mine)
        elif theirs != mine:
            differ = ", ".join(k for k in mine if theirs.get(k) != mine[k])
            raise CharlmError(f"the study {self.study_cfg.study_name} in the storage has another "
                              f"{differ}; give the same config and search, or another --study")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The file lock, and a database study's named lock for workers on other machines."""
        with open(self.study_cfg.out / ".tune.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            with database_lock(getattr(self.storage, "engine", None)):
                yield

    def counted(self) -> int:
        """Trials that count toward --trials: not an interrupted one (it is queued again on
        --resume), nor a queued one (it runs next)."""
        return sum(not t.user_attrs.get("interrupted") and t.state != TrialState.WAITING
                   for t in self.study.get_trials(deepcopy=False))

    def recover(self) -> None:
        """Before running: a RUNNING trial of a killed tuner of this machine is interrupted once
        its `charlm train` has ended; every interrupted trial is queued again."""
        if not self.wait_for_orphans():
            return
        with self.lock():
            trials = self.study.get_trials(deepcopy=False)
            for t in trials:
                if t.state == TrialState.RUNNING and self.orphaned(t):
                    self.study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
                    self.study.tell(t.number, state=TrialState.FAIL)
            trials = self.study.get_trials(deepcopy=False)
            queued = {t.user_attrs.get("resume_of") for t in trials}
            for t in trials:
                if t.user_attrs.get("interrupted") and t.number not in queued:
                    run_dir = Path(t.user_attrs.get("run_dir", ""))
                    again = {"resume_of": t.number}
                    if t.user_attrs.get("host") == self.host and saved(run_dir):
                        again["run_dir"] = str(run_dir)
                    self.study.enqueue_trial(t.params, user_attrs=again)

    def orphaned(self, trial: Any) -> bool:
        host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
        return host == self.host and pid.isdigit() and not alive(int(pid))

    def wait_while(self, running: Callable[[Any], bool],
                   lines: Callable[[list[Any]], dict[Any, str]], poll_s: float) -> bool:
        """Wait while a RUNNING trial is `running`, printing each of `lines` (by key) once;
        False if the user stopped the wait."""
        said = set()
        while not self.stop.requested.is_set():
            live = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                    if running(t)]
            if not live:
                return True
            for key, line in lines(live).items():
                if key not in said:
                    print(line, file=sys.stderr)
                    said.add(key)
            self.stop.requested.wait(poll_s)
        return False

    def wait_for_orphans(self) -> bool:
        """Wait while a killed tuner's trial still trains (its run dir is locked: on Linux it got
        a SIGTERM when its tuner died; elsewhere it trains to its end), so that it resumes from
        its own last save, never runs twice nor fails."""
        return self.wait_while(
            lambda t: self.orphaned(t) and t.user_attrs.get("run_dir")
            and in_use(Path(t.user_attrs["run_dir"])),
            lambda live: {t.number: f"waiting for trial {t.number}'s `charlm train`, left by a "
                          f"killed tuner, to end in {t.user_attrs['run_dir']} (Ctrl-C stops "
                          "waiting)" for t in live}, 0.5)

    def wait_for_others(self) -> None:
        """Wait for the trials other workers run, so that the table and best.yaml cover them."""
        self.wait_while(lambda t: not self.orphaned(t), lambda live: {
            None: f"waiting for {len(live)} trial(s) of other workers to end (Ctrl-C stops "
                  "waiting)"}, 1.0)

    def next_trial(self) -> Any:
        with self.lock():
            over = self.timeout is not None and time.monotonic() - self.start > self.timeout
            if self.stop.requested.is_set() or over or self.counted() >= self.trials:
                return None
            trial = self.study.ask()
            trial.set_user_attr("worker", f"{self.host}:{os.getpid()}")
            trial.set_user_attr("host", self.host)
            return trial

    def work(self, slot: int) -> None:
        """One worker's loop. An error (a database that went away) stops the study: the other
        workers' trials save and stop, and `run` raises it."""
        try:
            while (trial := self.next_trial()) is not None:
                self.run_one(trial, slot)
        except Exception as e:
            self.error = self.error or e
            self.stop.requested.set()

    def run_one(self, trial: Any, slot: int) -> None:
        study_cfg = self.study_cfg
        sampled = {p.key: p.suggest(trial) for p in study_cfg.search.sampled()}
        resumed = trial.user_attrs.get("run_dir")
        run_dir = Path(resumed or study_cfg.out.resolve() / f"trial-{trial.number:04d}")
        trial.set_user_attr("run_dir", str(run_dir))
        try:
            cfg = study_cfg.search.trial_config(study_cfg.trial_base(run_dir), sampled,
                                                f"trial {trial.number}")
        except CharlmError as e:
            return self.finish(trial, Outcome("failed", error=f"error: {e}"))
        configs = repeated(cfg, self.repeats)
        last = None if cfg.train.max_time is not None else cfg.train.max_iters  # budget: unknown
        done = resumed and last is not None and ended(
            [Path(c.train.out_dir) for c in configs], self.key, last)
        if done:  # its runs ended while no tuner watched: take their result as it is
            return self.finish(trial, done)
        runs = [self.command(c, bool(resumed)) for c in configs]
        outcome = run_trial(runs, self.env(slot), self.key, self.reporter(trial, last), self.stop)
        self.finish(trial, outcome)

    @staticmethod
    def command(cfg: RunConfig, resumed: bool) -> tuple[list[str], Path]:
        """The `charlm train` of one run of a trial, and its run dir: a resumed trial's run
        continues from its last.pt, or starts over if it saved none."""
        run_dir = Path(cfg.train.out_dir)
        cmd = [sys.executable, "-m", "charlm", "train"]
        if resumed and (run_dir / "last.pt").is_file():
            return [*cmd, "--out", str(run_dir), "--resume"], run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "trial.yaml")
        return [*cmd, str(run_dir / "trial.yaml"), *(["--overwrite"] if resumed else [])], run_dir

    def reporter(self, trial: Any, last_step: int | None = None) -> Any:
        """Report each eval's objective at its step (or its tokens seen, in base-config steps,
        when the search changes a step's tokens); True: prune it. The eval at `last_step` (its
        train.max_iters) is never pruned, so a trial that trained to its end is complete."""
        reported: set[int] = set()
        train = self.study_cfg.base["train"]
        tokens_per_eval = (train["batch_size"] * train["grad_accum"]
                           * self.study_cfg.base["model"]["block_size"] * train["eval_interval"])

        def report(event: dict[str, Any]) -> bool:
            value = event.get(self.key)
            at = event.get("step")
            if self.by_tokens and event.get("tokens") is not None:
                at = event["tokens"] // tokens_per_eval * train["eval_interval"]
            if value is None or at is None or at in reported or at <= 0:
                return False
            reported.add(at)
            trial.report(float(value), at)
            return (last_step is None or event["step"] < last_step) and trial.should_prune()

        return report

    def finish(self, trial: Any, outcome: Outcome) -> None:
        attrs = {"state": outcome.state, "step": outcome.step,
                 "seconds": round(outcome.seconds, 1), "error": outcome.error,
                 "interrupted": outcome.state == "interrupted" or None}
        for name, value in attrs.items():
            if value is not None:
                trial.set_user_attr(name, value)
        state = {"complete": TrialState.COMPLETE, "pruned": TrialState.PRUNED,
                 "diverged": TrialState.PRUNED}.get(outcome.state, TrialState.FAIL)
        self.study.tell(trial, outcome.value if state == TrialState.COMPLETE else None,
                        state=state)
        if self.bar is not None:
            self.bar.write(trial_line(trial.number, outcome, trial.params), file=sys.stderr)
            if outcome.state != "interrupted":
                self.bar.update()

    def env(self, slot: int) -> dict[str, str]:
        env = dict(os.environ)
        if self.workers > 1 and self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[slot]
        elif self.workers * self.repeats > 1:
            threads = str(max(1, (os.cpu_count() or 1) // (self.workers * self.repeats)))
            env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        return env

    def run(self) -> int | None:
        """Run the workers until done; the signal that stopped the study, if one did."""
        threads = [threading.Thread(target=self.work, args=(slot,), daemon=True)
                   for slot in range(self.workers)]
        with stop_signals(self.stop):
            self.recover()
            self.bar = tqdm(total=self.trials, initial=min(self.counted(), self.trials),
                            desc="tune", unit="trial", dynamic_ncols=True, disable=None)
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(0.2)
            if self.error is None:
                self.wait_for_others()
        self.bar.close()
        if isinstance(self.error, CharlmError):
            raise self.error
        if self.error is not None:
            raise CharlmError(f"the study stopped: {first_line(self.error)}; its trials so far are "
                              "saved: continue with `charlm tune --out "
                              f"{self.study_cfg.out} --resume` once the cause is fixed"
                              ) from self.error
        return self.stop.signum


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
