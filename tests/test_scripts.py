"""The benchmark scripts in scripts/: bad input ends with one line on stderr and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name, args, message", [
    ("bench_train.py", ["missing.yaml"], "error: config file not found: missing.yaml"),
    ("bench_train.py", [TINY, "--set", "model.n_layr=2"], "did you mean 'n_layer'?"),
    ("bench_sample.py", ["--configs", "missing.yaml"], "error: config file not found"),
    ("compare_variants.py", ["--config", TINY, "--eval-iters", "0"],
     "error: invalid config value train.eval_iters"),
])
def test_scripts_report_bad_config_in_one_line(name, args, message):
    result = run_script(name, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name, args", [
    ("bench_train.py", [TINY, "--steps", "0"]),
    ("bench_sample.py", ["--tokens", "0"]),
    ("compare_variants.py", ["--seconds", "0"]),
    ("compare_variants.py", ["--rounds", "0"]),
    ("bench_prepare.py", ["--mb", "0"]),
])
def test_scripts_reject_counts_that_are_not_positive(name, args):
    result = run_script(name, *args)
    assert result.returncode == 2
    assert "must be greater than 0, got 0" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name, description", [
    ("time_to_loss.py", "Time to a validation loss: run `charlm train CONFIG` and report the wall "
     "time, from the launch of the command, at which the val loss first reached --target, with "
     "the val curve."),
    ("bench_prepare.py", "Benchmark `charlm prepare`: MB/s and peak RSS on a generated text file "
     "(default 200 MB)."),
])
def test_script_help_describes_in_whole_sentences(name, description):
    """--help shows the docstring's first paragraph, not its first line cut mid-sentence."""
    result = run_script(name, "--help")
    assert result.returncode == 0, result.stderr
    assert description in " ".join(result.stdout.split())
