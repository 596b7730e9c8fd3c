"""Shared fixtures: the tiny config (2 layers, 32 dims, block 16), a small corpus, temp run dirs,
trained runs shared by the tests that only read them, and an in-process CLI runner. Helpers that
are not fixtures live in tests/helpers.py."""

from __future__ import annotations

import faulthandler
import os
import runpy
import signal
import sys
import threading
from pathlib import Path

import pytest
import torch

from charlm.cli.app import main
from charlm.config.loading import load_config
from charlm.config.schema import RunConfig
from tests.helpers import ROOT, SHAKESPEARE, TINY, CliResult, files_under, run_main

# Under pytest-xdist each core runs a worker: one thread each, in the worker and in the processes
# it starts (charlm train, torchrun), or the cores are oversubscribed and every op waits.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# No test takes a minute; one that runs for TEST_TIME_LIMIT seconds hangs. The watchdog then
# prints every thread's stack and the test's name and ends pytest, so a hang fails the suite at
# once, showing where, instead of holding CI until its time limit runs out.
# CHARLM_TEST_TIME_LIMIT=0 turns it off (for a debugger session).
TEST_TIME_LIMIT = float(os.environ.get("CHARLM_TEST_TIME_LIMIT", 600))
_REAL_STDERR = pytest.StashKey()


def pytest_configure(config: pytest.Config) -> None:
    # fd 2 as it is now, before capture redirects it for each test
    config.stash[_REAL_STDERR] = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Set up, run and tear down each test under the watchdog."""
    if TEST_TIME_LIMIT <= 0:
        yield
        return
    out, done = item.config.stash[_REAL_STDERR], threading.Event()

    def watch() -> None:
        if not done.wait(TEST_TIME_LIMIT):
            faulthandler.dump_traceback(out)
            out.write(f"\nerror: {item.nodeid} still runs after {TEST_TIME_LIMIT:g} s: it "
                      "hangs; the stacks above show where\n")
            out.flush()
            os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    # A hang that holds the GIL keeps that thread from running: then dump and exit from C.
    faulthandler.dump_traceback_later(TEST_TIME_LIMIT + 60, exit=True, file=out)
    try:
        yield
    finally:
        done.set()
        faulthandler.cancel_dump_traceback_later()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under the watchdog too: what is left of the run, and Python's exit (a thread that
    blocks it, say)."""
    if TEST_TIME_LIMIT > 0:
        faulthandler.dump_traceback_later(TEST_TIME_LIMIT, exit=True,
                                          file=session.config.stash[_REAL_STDERR])


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of configs/tiny.yaml over all of tiny-shakespeare (all 65 symbols), trained once
    for the tests that only read it (export, the Python API)."""
    from charlm.training.loop import train

    tmp = tmp_path_factory.mktemp("shakespeare_run")
    train(load_config(ROOT / "configs" / "tiny.yaml",
                      [f"train.out_dir={tmp / 'run'}", f"data.path={SHAKESPEARE}",
                       "train.max_iters=20"]))
    return tmp / "run"


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of configs/tiny.yaml as it is (60 steps) on the first 40,000 characters of
    tiny-shakespeare, trained once for the tests that sample from it or describe it."""
    from charlm.training.loop import train

    tmp = tmp_path_factory.mktemp("tiny_run")
    corpus = tmp / "corpus.txt"
    corpus.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    train(load_config(TINY, [f"train.out_dir={tmp / 'run'}", f"data.path={corpus}"]))
    return tmp / "run"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """The first 40,000 characters of tiny-shakespeare (all 65 symbols are not needed)."""
    path = tmp_path / "corpus.txt"
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    return path


@pytest.fixture
def tiny_cfg(tmp_path: Path, corpus: Path) -> RunConfig:
    """configs/tiny.yaml training on `corpus` into a temp run dir."""
    return load_config(ROOT / "configs" / "tiny.yaml", [
        f"train.out_dir={tmp_path / 'run'}", f"data.path={corpus}",
    ])


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """Run `charlm ARGS...` in-process; returns exit code, stdout and stderr."""

    def run(*args: str) -> CliResult:
        monkeypatch.setattr(sys, "argv", ["charlm", *map(str, args)])
        return run_main(capsys, lambda: main([str(a) for a in args]))

    return run


@pytest.fixture
def fails(cli, tmp_path: Path):
    """Run charlm with ARGS, expect exactly `error: MESSAGE`, exit code 2 and no file under
    tmp_path changed or removed (new files are allowed only where `new` says so)."""

    def run(*args, message: str, new: bool = False) -> CliResult:
        before = files_under(tmp_path)
        result = cli(*args)
        assert (result.code, result.err) == (2, f"error: {message}\n")
        after = files_under(tmp_path)
        assert {k: after.get(k) for k in before} == before
        if not new:
            assert after.keys() == before.keys()
        return result

    return run


@pytest.fixture
def run_script(monkeypatch, capsys):
    """Run a script of scripts/ as `python scripts/NAME ARGS` would, in this process: the
    refusals tested with it end before any work, and a child process would spend 3 s of each
    test importing torch again. An exception that escapes the script fails the test, as its
    traceback would fail the command's; the SIGTERM handler the script sets is put back."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the scripts import `common` by name

    def run(name: str, *args: str) -> CliResult:
        path = ROOT / "scripts" / name
        monkeypatch.setattr(sys, "argv", [str(path), *args])
        handler = signal.getsignal(signal.SIGTERM)
        try:
            return run_main(capsys, lambda: runpy.run_path(str(path), run_name="__main__"))
        finally:
            signal.signal(signal.SIGTERM, handler)

    return run
