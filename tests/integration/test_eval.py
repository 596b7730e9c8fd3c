"""`charlm eval` on a trained run: text it cannot read and options it refuses, its held-out
split, and a text far larger than its memory."""

import json
import subprocess
import sys

import pytest


def test_eval_and_prompt_file_reject_non_utf8(cli, tiny_run, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9".encode("latin-1"))
    result = cli("eval", tiny_run, bad)
    assert (result.code, result.err) == (
        2, f"error: {bad} is not valid UTF-8 text (invalid byte 0xe9 at byte offset 3); charlm "
           "reads text files as UTF-8, convert it first\n")
    prompt = cli("sample", tiny_run, "--prompt-file", bad)
    assert (prompt.code, prompt.err) == (result.code, result.err)
    missing = cli("eval", tiny_run, tmp_path / "nope.txt")
    assert (missing.code, missing.err) == (
        2, f"error: input file not found: {tmp_path / 'nope.txt'}\n")


def test_eval_rejects_an_unknown_policy(cli, tiny_run, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("First Citizen:\n", encoding="utf-8")
    result = cli("eval", tiny_run, text, "--unknown", "drop")
    assert (result.code, result.err, result.out) == (
        2, "error: --unknown must be 'error' or 'skip', got 'drop'\n", "")


def test_eval_split_val_scores_the_runs_own_cache(cli, tiny_run):
    """`charlm eval RUN --split val` finds the dataset `charlm train` prepared in the run dir
    and scores its val split once; a run without a benchmark's test split has no --split test."""
    import numpy as np

    val = np.fromfile(tiny_run / "dataset" / "val.bin", dtype=np.uint8)
    result = cli("eval", tiny_run, "--split", "val", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["chars_scored"] == len(val) - 1 == 3_999
    missing = cli("eval", tiny_run, "--split", "test")
    assert (missing.code, missing.out, missing.err) == (2, "", (
        f"error: --split test: dataset {tiny_run / 'dataset'} has no test split (only a "
        "benchmark prepared with `charlm prepare --benchmark` has one); use --split val\n"))


# Run in a child: after one small eval (torch's threads and the model loaded), the address
# space is capped at what it then holds plus 256 MiB, then a 30,000,000-character text is scored.
CAPPED_EVAL = """
import resource, sys
from charlm.cli.app import main

def run(*args):
    try:
        main(list(args))
    except SystemExit as e:
        if e.code:
            raise
run("eval", sys.argv[1], sys.argv[2])
peak = int(open("/proc/self/status").read().split("VmPeak:")[1].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (peak + (256 << 20),) * 2)
run("eval", sys.argv[1], sys.argv[3], "--unknown", "skip")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc: Linux")
def test_eval_streams_a_text_far_larger_than_its_memory_allows(tiny_run, tmp_path):
    """`charlm eval` held about 31 bytes a character (a 30 MB text took 0.93 GB) and listed
    every unknown character: under a cap of 256 MiB more than a small eval takes, 30,000,000
    characters it does not know, between two lines it does, are read, counted and skipped."""
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n")
    with open(big, "w", encoding="utf-8") as f:
        f.write("First Citizen:\n")
        for _ in range(30):
            f.write("@" * 1_000_000)
        f.write("Before we proceed any further, hear me speak.\n")
    result = subprocess.run([sys.executable, "-c", CAPPED_EVAL, tiny_run, small, big],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "warning: skipped 30,000,000 characters outside the vocabulary\n"
    assert result.stdout.splitlines()[1].endswith(", 60 characters scored")
