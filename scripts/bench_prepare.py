"""Benchmark `charlm prepare`: MB/s and peak RSS on a generated text file (default 200 MB).

The file is tiny-shakespeare repeated: ASCII. In one run, `charlm prepare FILE --out DIR` and a
plain two-pass numpy encoder (a byte histogram, then a lookup-table encode, in 1 MB chunks) each
run in a child process of their own, timed end to end (interpreter start, imports and writing
the files included), with the peak RSS of that process alone. The reference does less than
prepare (no UTF-8 validation, no sha256, no meta.json, no fsync) and must write the same
train.bin and val.bin (`same_ids`). Prints one JSON line: both speeds, their ratio, both peak
RSS, and the machine (CPU model, cores, Python, numpy and torch versions).

    python scripts/bench_prepare.py [--mb 200] [--repeat 1]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from common import cpu_model, positive, run_script, summary

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 0.8  # issue 19: prepare at no less than 0.8x the reference's speed

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


def make_input(path: Path, megabytes: int) -> int:
    block = (ROOT / "data" / "tinyshakespeare.txt").read_bytes()  # ASCII
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


def run_child(args: list[str], scratch: Path) -> tuple[float, float]:
    """Run one command in a child process: (wall seconds from its launch to its exit, its own
    peak RSS in MB). Its output goes to files in `scratch`, shown if it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(scratch / "stdout", "wb") as out, open(scratch / "stderr", "wb") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, env=env, cwd=scratch)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # Ctrl-C or SIGTERM: stop the child too
            proc.kill()
            proc.wait()
            raise
        seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(args[:4])} ... failed with exit code "
                         f"{proc.returncode}: {(scratch / 'stderr').read_text().strip()}")
    return seconds, maxrss_mb(usage.ru_maxrss)


def version(package: str) -> str | None:
    """A package's installed version, read without importing it (torch takes seconds)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--mb", type=positive(int), default=200,
                        help="size of the generated file in MB")
    parser.add_argument("--repeat", type=positive(int), default=1,
                        help="runs of each, alternating; the fastest of each is reported")
    args = parser.parse_args()
    val_fraction = 0.1
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src = tmp / "big.txt"
        size = make_input(src, args.mb)
        charlm_ds, reference_ds = tmp / "charlm", tmp / "reference"
        reference_ds.mkdir()
        charlm = [sys.executable, "-m", "charlm", "prepare", str(src), "--out", str(charlm_ds),
                  "--val-fraction", str(val_fraction)]
        reference = [sys.executable, "-c", REFERENCE, str(src), str(reference_ds),
                     str(val_fraction)]
        runs: dict[str, list[tuple[float, float]]] = {"reference": [], "charlm": []}
        for _ in range(args.repeat):
            runs["reference"].append(run_child(reference, tmp))
            runs["charlm"].append(run_child(charlm, tmp))
        same_ids = all(filecmp.cmp(charlm_ds / name, reference_ds / name, shallow=False)
                       for name in ("train.bin", "val.bin"))
        meta = json.loads((charlm_ds / "meta.json").read_text(encoding="utf-8"))
    best = {name: min(r) for name, r in runs.items()}  # (seconds, peak RSS) of the fastest run
    speed = {name: size / 1e6 / seconds for name, (seconds, _) in best.items()}
    ratio = speed["charlm"] / speed["reference"]
    print(json.dumps({
        "input_mb": round(size / 1e6, 1), "repeat": args.repeat,
        "charlm_mb_per_s": round(speed["charlm"], 1),
        "reference_mb_per_s": round(speed["reference"], 1),
        "ratio": round(ratio, 2), "target_ratio": TARGET_RATIO,
        "meets_target": ratio >= TARGET_RATIO,
        "charlm_seconds": round(best["charlm"][0], 2),
        "reference_seconds": round(best["reference"][0], 2),
        "charlm_peak_rss_mb": round(best["charlm"][1], 1),
        "reference_peak_rss_mb": round(best["reference"][1], 1),
        "same_ids": same_ids, "vocab_size": meta["vocab_size"],
        "train_tokens": meta["train_tokens"], "val_tokens": meta["val_tokens"],
        "cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
        "numpy": version("numpy"), "torch": version("torch"),
    }))


if __name__ == "__main__":
    run_script(main)
