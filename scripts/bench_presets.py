"""The CPU presets against nanoGPT's CPU recipe, side by side on this machine: nanoGPT's wall
time to its final val loss (1.886 in its README), then each preset's wall time to its target
(`scripts/time_to_loss.py`), as a fraction of nanoGPT's time.

    git clone https://github.com/karpathy/nanoGPT /tmp/nanoGPT     # once; never committed here
    python scripts/bench_presets.py --nanogpt /tmp/nanoGPT [--repeat 1] [--skip-nanogpt S]
        [--set section.key=value ...]

nanoGPT runs from a copy in a temporary dir, on data/tinyshakespeare.txt encoded as its
shakespeare_char/prepare.py does (sorted characters, the first 90 % for training), with its
README's CPU command line. Its time is taken from launch to the line of its last eval. The
targets (issue 19): `shakespeare_char_cpu.yaml` at val <= 1.88 in at most 0.25x that time,
`shakespeare_char_cpu_long.yaml` at <= 1.70 in at most 0.75x. --set changes both presets
alike (`--set train.dtype=float32` times them without bf16 autocast on a CPU with AMX or
AVX512_BF16). Prints the machine's facts, one JSON line per run and a table.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import machine_facts, machine_line, positive, run_script, summary

from charlm.config.loading import load_config

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "data" / "tinyshakespeare.txt"
PRESETS = [("configs/shakespeare_char_cpu.yaml", 1.88, 0.25),
           ("configs/shakespeare_char_cpu_long.yaml", 1.70, 0.75)]
RECIPE = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1",
          "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
          "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
EVAL_LINE = re.compile(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


def nanogpt_data(dest: Path) -> None:
    """tinyshakespeare as nanoGPT's shakespeare_char/prepare.py writes it: uint16 ids of the
    sorted characters, the first 90 % in train.bin, the rest in val.bin, and meta.pkl."""
    text = TEXT.read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = np.array([stoi[ch] for ch in text], dtype=np.uint16)
    cut = int(len(text) * 0.9)
    ids[:cut].tofile(dest / "train.bin")
    ids[cut:].tofile(dest / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    (dest / "meta.pkl").write_bytes(pickle.dumps(meta))


def run_nanogpt(clone: Path) -> dict:
    """nanoGPT's CPU recipe from a copy of `clone`: the wall time of each eval line from launch."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "nanoGPT"
        shutil.copytree(clone, repo, ignore=shutil.ignore_patterns(".git"))
        nanogpt_data(repo / "data" / "shakespeare_char")
        cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", *RECIPE]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        curve = []
        for line in proc.stdout:
            if match := EVAL_LINE.match(line):
                curve.append({"step": int(match[1]), "wall_s": round(time.perf_counter() - t0, 2),
                              "val_loss": float(match[3])})
        if proc.wait() != 0 or not curve:
            sys.exit(f"nanoGPT failed ({proc.returncode}); its command: {' '.join(cmd)}")
    return {"run": "nanoGPT CPU recipe", "time_s": curve[-1]["wall_s"],
            "final_val": curve[-1]["val_loss"], "curve": curve}


def run_preset(config: str, target: float, max_seconds: float, overrides: list[str]) -> dict:
    """`scripts/time_to_loss.py` on a preset with `--set` overrides, stopped at its target:
    its JSON result."""
    sets = [arg for item in overrides for arg in ("--set", item)]
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "time_to_loss.py"), str(ROOT / config),
         "--target", f"{target}", "--stop-at-target", "--max-seconds", f"{max_seconds:g}",
         *sets], check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    result.pop("machine")
    return {"run": config, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--nanogpt", type=Path, help="a clone of karpathy/nanoGPT")
    parser.add_argument("--skip-nanogpt", type=positive(float), metavar="SECONDS",
                        help="use this nanoGPT time (from an earlier run here) instead")
    parser.add_argument("--repeat", type=positive(int), default=1,
                        help="runs of each preset (default 1)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a config override for both presets")
    args = parser.parse_args()
    if args.skip_nanogpt is None and (args.nanogpt is None or
                                      not (args.nanogpt / "train.py").exists()):
        parser.error("--nanogpt must name a clone of karpathy/nanoGPT (or give --skip-nanogpt)")
    for config, _, _ in PRESETS:  # a bad --set is said now, not after nanoGPT's minutes
        load_config(ROOT / config, args.overrides)
    facts = machine_facts()
    print(machine_line(facts), flush=True)
    if args.skip_nanogpt is None:
        ref = run_nanogpt(args.nanogpt)
        print(json.dumps(ref), flush=True)
    else:
        ref = {"run": "nanoGPT CPU recipe (given)", "time_s": args.skip_nanogpt}
    rows = []
    for config, target, fraction in PRESETS:
        for _ in range(args.repeat):
            result = run_preset(config, target, 1.5 * ref["time_s"], args.overrides)
            print(json.dumps(result), flush=True)
            rows.append((config, target, fraction, result["time_to_target_s"]))
    print(f"\nnanoGPT's CPU recipe: {ref['time_s']:.1f} s to its final val "
          f"{ref.get('final_val', '(given)')}")
    if args.overrides:
        print(f"both presets with --set {' --set '.join(args.overrides)}")
    print("| preset | target | time to target | vs nanoGPT | goal |")
    print("|---|---|---|---|---|")
    for config, target, fraction, seconds in rows:
        got = "not reached" if seconds is None else f"{seconds:.1f} s"
        ratio = "-" if seconds is None else f"{seconds / ref['time_s']:.2f}x"
        print(f"| {Path(config).name} | {target} | {got} | {ratio} | <= {fraction}x |")


if __name__ == "__main__":
    run_script(main)
