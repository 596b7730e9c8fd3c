"""`charlm tune`'s errors, each one line, before any trial runs, and its exit code when stopped."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY

pytest.importorskip("optuna")  # the errors past the check that Optuna is installed


def test_tune_command_errors_are_one_line(cli, tmp_path: Path, corpus: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "study"
    lr = "optim.lr={type: float, low: 1e-3, high: 1e-2}"
    cases = [
        ((TINY, "--out", out), "error: give the search space with --search FILE or --search "
                               "KEY=SPEC"),
        (("--out", out, "--resume"), f"error: --resume: {out} holds no study (tune.yaml is "
                                     "missing); start one with `charlm tune CONFIG --search FILE "
                                     "--out DIR`"),
        ((TINY, "--search", lr, "--out", out, "--storage", "sqlite:///x.db"),
         "error: --storage: SQLite cannot take several workers at once; use the default journal "
         "file in --out, or PostgreSQL / MySQL"),
        ((TINY, "--search", lr, "--out", out, "--objective", "val_cer"),
         "error: objective val_cer is measured on pairs (model.arch=encoder_decoder); a GPT's "
         "objectives are best_val_loss, final_val_loss"),
        ((TINY, "--search", lr, "--out", out, "--workers", "0"),
         "error: --workers must be >= 1, got 0"),
        ((TINY, "--search", lr, "--out", out, "--repeats", "0"),
         "error: repeats in the options: 0 must be an integer >= 1"),
        ((TINY, "--search", "optim.lr={type: float, low: 1e-4, high: 1e-2}", "--out", out),
         "error: the search space can give an invalid config: with optim.lr=0.0001: invalid "
         "config value optim.min_lr"),
    ]
    for args, line in cases:
        result = cli("tune", *args, "--data", corpus) if args[0] == TINY else cli("tune", *args)
        assert (result.code, result.err.splitlines()[0][:len(line)]) == (2, line)
        assert len(result.err.splitlines()) == 1
        assert not (out / "tune.yaml").exists()
    monkeypatch.setitem(sys.modules, "optuna", None)  # the extra is not installed
    result = cli("tune", TINY, "--search", lr, "--out", out)
    assert (result.code, result.err) == (
        2, "error: charlm tune needs Optuna: pip install 'charlm[tune]'\n")


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_study_stopped_by_a_signal_exits_128_plus_its_number(
        cli, tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch, signum: int,
        code: int) -> None:
    """One exit code per signal, as `charlm train`'s: SIGTERM gave 130 before."""
    from charlm.tune.runner import Tuner
    from charlm.tune.trial import Outcome

    def stopped(self, trial, slot: int) -> None:  # a trial that the signal interrupts
        os.kill(os.getpid(), signum)  # handled on the main thread, which waits for the workers
        assert self.stop.requested.wait(10)
        self.finish(trial, Outcome("interrupted"))

    monkeypatch.setattr(Tuner, "run_one", stopped)
    out = tmp_path / "study"
    result = cli("tune", TINY, "--search", "optim.lr=[0.002, 0.01]", "--data", corpus,
                 "--out", out)
    assert result.code == code
    assert result.err.splitlines()[-1] == (
        f"stopped: the study is saved; continue it with `charlm tune --out {out} --resume`")
