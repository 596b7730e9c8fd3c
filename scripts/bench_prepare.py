"""Benchmark `charlm prepare`: MB/s and peak RSS on a generated text file (default 200 MB).

The file is tiny-shakespeare repeated, with a few non-ASCII characters mixed in so the
multi-byte UTF-8 path is exercised. `prepare` runs in a child process so its peak RSS is its own;
`mb_per_s` times the `prepare` call itself, `process_seconds` the whole child process.

    python scripts/bench_prepare.py [--mb 200]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import positive, run_script, summary

ROOT = Path(__file__).resolve().parents[1]


def make_input(path: Path, megabytes: int) -> int:
    base = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    block = (base + "Ünïcödé — ☃ 𝄞 ñ €\n").encode("utf-8")
    target = megabytes * 1_000_000
    with open(path, "wb") as f:
        written = 0
        while written < target:
            piece = block[: target - written]
            piece = piece.decode("utf-8", "ignore").encode("utf-8")  # whole characters only
            f.write(piece)
            written += len(piece)
    return written


def maxrss_mb(maxrss: int) -> float:
    """getrusage's ru_maxrss in MB (10^6 bytes, as input_mb and mb_per_s): Linux gives KiB,
    macOS bytes."""
    return maxrss * (1 if sys.platform == "darwin" else 1024) / 1e6



def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--mb", type=positive(int), default=200,
                        help="size of the generated file in MB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "big.txt"
        size = make_input(src, args.mb)
        code = ("import sys, time; from charlm.data import prepare; t = time.perf_counter(); "
                "prepare([sys.argv[1]], sys.argv[2], 0.1, progress=False); "
                "print(time.perf_counter() - t)")
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, "-c", code, str(src), str(Path(tmp) / "ds")],
                               check=True, capture_output=True, text=True)
        process_seconds = time.perf_counter() - t0
        seconds = float(child.stdout)
        peak_mb = maxrss_mb(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
        meta = json.loads((Path(tmp) / "ds" / "meta.json").read_text(encoding="utf-8"))
    print(json.dumps({
        "input_mb": round(size / 1e6, 1), "seconds": round(seconds, 2),
        "mb_per_s": round(size / 1e6 / seconds, 1),
        "process_seconds": round(process_seconds, 2),  # with interpreter start and imports
        "peak_rss_mb": round(peak_mb, 1),
        "vocab_size": meta["vocab_size"], "train_tokens": meta["train_tokens"],
        "val_tokens": meta["val_tokens"],
    }))


if __name__ == "__main__":
    run_script(main)
