"""`bench.py prepare`: MB/s and peak RSS of `charlm prepare` on a generated text file (default
200 MB) against a plain two-pass numpy encoder (a byte histogram, then a lookup-table encode, in
1 MB chunks).

The file is tiny-shakespeare repeated: ASCII (`--text mixed` interleaves lines of French,
Greek and Russian, so every chunk is decoded, and the reference, which counts bytes, writes other
ids: `same_ids` is then null). `--cap-mb N` runs charlm's prepare under an address-space limit of
N MB (RLIMIT_AS, as `prlimit --as` sets it): a corpus many times larger still prepares, its memory
bounded by a constant. In every round the reference and then
`charlm prepare FILE --out DIR` each run in a child process of their own, timed end to end
(interpreter start, imports and writing the files included), with the peak RSS of that process
alone; `vs_reference` is charlm's speed over the reference's in the same round (issue 19's
target: 0.8x or more). The reference does less than prepare (no UTF-8 validation, no sha256, no
meta.json, no fsync) and must write the same train.bin and val.bin (`same_ids`). Everything is
written in a temporary directory, removed at the end."""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from common import positive

from benchlib.harness import ROOT, Bench, charlm_env, interleave

TARGET_RATIO = 0.8  # issue 19: prepare at no less than 0.8x the reference's speed
VAL_FRACTION = 0.1

# The reference: what one would write by hand with numpy for a file of 1-byte characters.
REFERENCE = """
import sys
import numpy as np

src, out, val_fraction = sys.argv[1], sys.argv[2], float(sys.argv[3])
chunk = 1 << 20
counts = np.zeros(256, dtype=np.int64)
with open(src, "rb") as f:
    while data := f.read(chunk):
        counts += np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
present = np.flatnonzero(counts)
lut = np.zeros(256, dtype=np.uint8)
lut[present] = np.arange(len(present))
n_train = int(counts.sum() * (1 - val_fraction))
done = 0
with open(src, "rb") as f, open(out + "/train.bin", "wb") as ftrain, \\
        open(out + "/val.bin", "wb") as fval:
    while data := f.read(chunk):
        ids = lut[np.frombuffer(data, dtype=np.uint8)]
        cut = min(max(n_train - done, 0), len(ids))
        ids[:cut].tofile(ftrain)
        ids[cut:].tofile(fval)
        done += len(ids)
"""


MIXED = "Le cœur a ses raisons. Ἐν ἀρχῇ ἦν ὁ λόγος. Съешь же ещё этих мягких булок.\n"


def make_input(path: Path, megabytes: int, text: str) -> int:
    block = (ROOT / "data" / "tinyshakespeare.txt").read_bytes()  # ASCII
    if text == "mixed":  # a non-ASCII line after every tenth line
        lines = block.decode("ascii").splitlines(keepends=True)
        block = "".join(line + (MIXED if i % 10 == 9 else "")
                        for i, line in enumerate(lines)).encode("utf-8")
    target = megabytes * 1_000_000
    with open(path, "wb") as f:
        written = 0
        while written < target:
            piece = block[: target - written]
            f.write(piece)
            written += len(piece)
    return written


def maxrss_mb(maxrss: int) -> float:
    """getrusage's ru_maxrss in MB (10^6 bytes, as input_mb and mb_per_s): Linux gives KiB,
    macOS bytes."""
    return maxrss * (1 if sys.platform == "darwin" else 1024) / 1e6


# Starts a command and reports its wall time and peak RSS. A process forked from this one
# (torch imported: some 240 MB) would count this one's RSS as its own peak (Linux keeps the
# high-water mark across exec), so the command is started from this small interpreter instead.
LAUNCHER = """
import json, os, resource, subprocess, sys, time
out, err, cap, *cmd = sys.argv[1:]
def limit():
    if int(cap):
        resource.setrlimit(resource.RLIMIT_AS, (int(cap) << 20, int(cap) << 20))
with open(out, "wb") as o, open(err, "wb") as e:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=o, stderr=e, preexec_fn=limit)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "code": os.waitstatus_to_exitcode(status),
                  "maxrss": usage.ru_maxrss}))
"""


def run_child(args: list[str], scratch: Path, cap_mb: int = 0) -> tuple[float, float]:
    """Run one command in a child process: (wall seconds from its launch to its exit, its own
    peak RSS in MB), under an address-space limit of `cap_mb` MB if not 0. Its output goes to
    files in `scratch`, shown if it fails."""
    out, err = scratch / "stdout", scratch / "stderr"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(out), str(err), str(cap_mb),
                             *args],
                            stdout=subprocess.PIPE, env=charlm_env(), cwd=scratch,
                            start_new_session=True)
    try:
        result = json.loads(proc.communicate()[0])
    except BaseException:  # Ctrl-C or SIGTERM: stop the command too
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if result["code"] != 0:
        raise SystemExit(f"error: {' '.join(args[:4])} ... failed with exit code "
                         f"{result['code']}: {err.read_text().strip()}")
    return result["seconds"], maxrss_mb(result["maxrss"])


def version(package: str) -> str | None:
    """A package's installed version, read without importing it."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mb", type=positive(int), default=200,
                        help="size of the generated file in MB (default 200)")
    parser.add_argument("--text", choices=("ascii", "mixed"), default="ascii",
                        help="ascii: tiny-shakespeare; mixed: with French, Greek and Russian")
    parser.add_argument("--cap-mb", type=positive(int), default=None,
                        help="run charlm's prepare under this address-space limit (MB)")


def figures(args: argparse.Namespace) -> Iterator[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "big.txt"
        size = make_input(src, args.mb, args.text)
        charlm_ds, reference_ds = tmp / "charlm", tmp / "reference"
        reference_ds.mkdir()
        commands = {
            "reference": [sys.executable, "-c", REFERENCE, str(src), str(reference_ds),
                          str(VAL_FRACTION)],
            "charlm": [sys.executable, "-m", "charlm", "prepare", str(src), "--out",
                       str(charlm_ds), "--val-fraction", str(VAL_FRACTION)]}

        def runner(command: list[str], cap_mb: int = 0):
            def run() -> dict:
                seconds, rss = run_child(command, tmp, cap_mb)
                return {"seconds": round(seconds, 3), "mb_per_s": round(size / 1e6 / seconds, 1),
                        "peak_rss_mb": round(rss, 1)}
            return run

        caps = {"charlm": args.cap_mb or 0}
        yield from interleave({name: runner(c, caps.get(name, 0)) for name, c in commands.items()},
                              args.rounds)
        meta = json.loads((charlm_ds / "meta.json").read_text(encoding="utf-8"))
        yield {"input_mb": round(size / 1e6, 1), "text": args.text, "cap_mb": args.cap_mb,
               "target_ratio": TARGET_RATIO,
               "same_ids": all(filecmp.cmp(charlm_ds / name, reference_ds / name, shallow=False)
                               for name in ("train.bin", "val.bin"))
               if args.text == "ascii" else None,
               "vocab_size": meta["vocab_size"], "train_tokens": meta["train_tokens"],
               "val_tokens": meta["val_tokens"], "python": platform.python_version(),
               "numpy": version("numpy")}


BENCH = Bench("prepare", __doc__, add_arguments, figures, case=(), metric="mb_per_s",
              metrics=("seconds", "peak_rss_mb"), rounds=1)
