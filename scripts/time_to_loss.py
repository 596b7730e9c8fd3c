"""Time to a validation loss: run `charlm train CONFIG` and report the wall time, from the launch
of the command, at which the val loss first reached --target, with the val curve.

    python scripts/time_to_loss.py [CONFIG] --target 1.88 [--set section.key=value ...]

Without CONFIG it trains the built-in defaults (`charlm train` with no config).

It watches the run's metrics.jsonl while the command runs, so the time includes interpreter start,
imports and data preparation, as a user would see it. Also printed: each eval's `elapsed_s` as
logged by the trainer (from the start of training), the val loss at --at seconds, and the
machine's facts (CPU model, cores, torch threads and version), all in one JSON line.

The run is ended after --max-seconds (default 300) from launch, reached or not, so a preset's
fixed number of steps cannot hold a slow CPU for long; `stopped_at_max_seconds` then says so,
and the figures cover the evals it made.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine_facts, positive, run_script, summary


def watch(proc: subprocess.Popen, metrics: Path, target: float, stop_at_target: bool,
          t0: float, max_seconds: float = float("inf")) -> tuple[list[dict], dict | None, bool]:
    """Follow the run's metrics.jsonl until `proc` ends, ending it once `max_seconds` have
    passed since `t0`: its val curve, with the wall time from `t0` at which each eval was seen,
    the first eval at or below `target` (None if none), and whether the time ran out."""
    seen, curve, hit, cut = 0, [], None, False
    while True:
        done = proc.poll() is not None
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        now = time.perf_counter() - t0
        for line in lines[seen:]:
            if not line.endswith("}"):
                break  # a line still being written
            event = json.loads(line)
            seen += 1
            if event["event"] != "eval":
                continue
            val = event["val_loss"]  # null when not finite
            curve.append({"step": event["step"], "wall_s": round(now, 2),
                          "elapsed_s": event["elapsed_s"],
                          "val_loss": None if val is None else round(val, 4)})
            if hit is None and val is not None and val <= target:
                hit = curve[-1]
                if stop_at_target:
                    proc.terminate()
        if done:
            break
        if now >= max_seconds and not cut:
            proc.terminate()
            cut = True
        time.sleep(0.02)
    return curve, hit, cut


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("config", nargs="?")
    parser.add_argument("--target", type=positive(float), default=1.88)
    parser.add_argument("--at", type=positive(float), default=60.0,
                        help="also report val at this wall time")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--stop-at-target", action="store_true",
                        help="end the run once the target is reached")
    parser.add_argument("--max-seconds", type=positive(float), default=300.0,
                        help="end the run after this wall time from launch, reached or not "
                        "(default 300)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "charlm", "train", *([args.config] if args.config else []),
               "--out", str(run)]
        for item in args.overrides:
            cmd += ["--set", item]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            curve, hit, cut = watch(proc, run / "metrics.jsonl", args.target,
                                    args.stop_at_target, t0, args.max_seconds)
        finally:
            if proc.poll() is None:  # Ctrl-C or SIGTERM: end the run before its dir is removed
                proc.terminate()
                proc.wait()
        err = proc.stderr.read() if proc.stderr else ""
        if proc.returncode == 2 and hit is None:  # bad input: charlm's own `error:` line
            sys.stderr.write(err)
            sys.exit(2)
        if proc.returncode not in (0, 143, -15) and hit is None and not cut:
            sys.exit(f"charlm train failed ({proc.returncode}): {err.strip()[-500:]}")
    before = [c for c in curve if c["wall_s"] <= args.at]
    print(json.dumps({
        "machine": machine_facts(),
        "config": args.config, "overrides": args.overrides, "target": args.target,
        "time_to_target_s": hit["wall_s"] if hit else None,
        "step_at_target": hit["step"] if hit else None,
        "trainer_elapsed_at_target_s": hit["elapsed_s"] if hit else None,
        f"val_at_{args.at:g}s": before[-1]["val_loss"] if before else None,
        "final_val": curve[-1]["val_loss"] if curve else None,
        "total_wall_s": round(time.perf_counter() - t0, 2), "stopped_at_max_seconds": cut,
        "curve": curve,
    }))


if __name__ == "__main__":
    run_script(main)
