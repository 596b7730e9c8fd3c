"""Time to a validation loss: run `charlm train` in a child process and take the wall time, from
its launch, at which the val loss first reached a target, with the val curve.

The run's metrics.jsonl is watched while the command runs, so the time includes interpreter
start, imports and data preparation, as a user would see it; each eval's `elapsed_s` as the
trainer logged it (from the start of training) comes with it. The run is ended once the target
is reached (unless asked to run on) and after `max_seconds` from launch, reached or not, so a
config's fixed number of steps cannot hold a slow CPU for long; `stopped_at_max_seconds` then
says so. The run lives in a temporary directory, removed at the end, also when Ctrl-C or
SIGTERM stop the caller (the run is ended first). With `score`, the model the run kept (best.pt,
else last.pt) is scored on its whole val split in windows of block_size laid end to end
(`charlm eval --split val --stride 0`): `full_val`, what nanoGPT's random val windows estimate,
without their noise."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchlib.harness import charlm_env


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


def time_to_loss(config: str | None, overrides: list[str], target: float,
                 stop_at_target: bool = True, max_seconds: float = float("inf"),
                 score: bool = False) -> dict:
    """`charlm train CONFIG --set ...` (the built-in defaults without CONFIG) timed to `target`:
    the wall time from launch at which it was reached (`seconds`, None if not), that eval's step
    and trainer time, the last val loss, the whole run's wall time and the curve (with `score`,
    `full_val`) and the model it trained (`model`: "4 x 192, block 128", its dropout when any,
    from the run's config.yaml, where a sized pick is recorded)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "charlm", "train", *([config] if config else []),
               "--out", str(run), *[a for item in overrides for a in ("--set", item)]]
        t0 = time.perf_counter()
        with open(Path(tmp) / "stderr", "w+") as err:  # a file: a pipe left unread can fill
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True,
                                    env=charlm_env())
            try:
                curve, hit, cut = watch(proc, run / "metrics.jsonl", target, stop_at_target,
                                        t0, max_seconds)
            finally:
                if proc.poll() is None:  # Ctrl-C or SIGTERM: end the run before its dir goes
                    proc.terminate()
                    proc.wait()
            err.seek(0)
            message = err.read()
        if proc.returncode == 2 and hit is None:  # bad input: charlm's own `error:` line
            sys.stderr.write(message)
            sys.exit(2)
        if proc.returncode not in (0, 143, -15) and hit is None and not cut:
            raise SystemExit(f"error: charlm train failed ({proc.returncode}): "
                             f"{message.strip()[-500:]}")
        wall = round(time.perf_counter() - t0, 2)
        full_val = full_val_loss(run) if score else None
        model = shape(run / "config.yaml")
    return {"model": model, "seconds": hit["wall_s"] if hit else None,
            "step_at_target": hit["step"] if hit else None,
            "trainer_elapsed_at_target_s": hit["elapsed_s"] if hit else None,
            "final_val": curve[-1]["val_loss"] if curve else None,
            "total_wall_s": wall, "stopped_at_max_seconds": cut, "curve": curve,
            "full_val": full_val}


def full_val_loss(run: Path) -> float:
    """The loss of `run`'s kept model over its whole val split, windows end to end."""
    cmd = [sys.executable, "-m", "charlm", "eval", str(run), "--split", "val", "--stride", "0",
           "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=charlm_env())
    if done.returncode != 0:
        raise SystemExit(f"error: charlm eval failed ({done.returncode}): "
                         f"{done.stderr.strip()[-500:]}")
    return round(json.loads(done.stdout)["loss"], 4)


def shape(config: Path) -> str | None:
    """The model a run's config.yaml names, in a few words (None before the run wrote one)."""
    if not config.is_file():
        return None
    m = yaml.safe_load(config.read_text())["model"]
    dropout = f", dropout {m['dropout']}" if m.get("dropout") else ""
    return f"{m['n_layer']} x {m['n_embd']}, block {m['block_size']}{dropout}"
