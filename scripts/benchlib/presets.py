"""`bench.py presets`: the wall time from launch for `charlm train` to reach a val loss
(`benchlib.loss`), for the CPU presets or the configs given, and with --nanogpt beside
nanoGPT's CPU recipe, each round running nanoGPT and then every config in turn; `vs_nanoGPT` is
a config's time over nanoGPT's in the same round.

    git clone https://github.com/karpathy/nanoGPT /tmp/nanoGPT     # once; never committed here

nanoGPT runs from a copy in a temporary directory, on data/tinyshakespeare.txt encoded as its
shakespeare_char/prepare.py does (sorted characters, the first 90 % for training), with its
README's CPU command line; its time is from launch to the line of its last eval. The presets'
targets (issue 19): `shakespeare_char_cpu.yaml` at val <= 1.88 in at most 0.25x nanoGPT's time
(`goal`), `shakespeare_char_cpu_long.yaml` at <= 1.70 in at most 0.75x; another config needs
--target. `defaults` names the built-in defaults (`charlm train` with no config). --set
changes every config alike (`--set train.dtype=float32` times them without bf16 autocast on a
CPU with AMX or AVX512_BF16). A run ends at its target (--full: at its end) or after
--max-seconds (default: 1.5x nanoGPT's time in the round, else 300)."""

from __future__ import annotations

import argparse
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from common import positive

from benchlib.harness import ROOT, Bench
from benchlib.loss import time_to_loss
from charlm.config.loading import load_config
from charlm.core.errors import CharlmError

TEXT = ROOT / "data" / "tinyshakespeare.txt"
# a preset's target val loss and its goal: the share of nanoGPT's time to reach it in
PRESETS = {"shakespeare_char_cpu.yaml": (1.88, 0.25),
           "shakespeare_char_cpu_long.yaml": (1.70, 0.75)}
RECIPE = ["--device=cpu", "--compile=False", "--eval_iters=20", "--log_interval=1",
          "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
          "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0"]
EVAL_LINE = re.compile(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)")
ITER_LINE = re.compile(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms")
# run in nanoGPT's copy after its run: the loss of the model it kept (ckpt.pt, saved at its best
# val) over the whole val.bin in windows of block_size end to end, as `charlm eval --stride 0`
SCORE = """
import numpy as np, torch
from model import GPT, GPTConfig
ckpt = torch.load("out-shakespeare-char/ckpt.pt", map_location="cpu")
model = GPT(GPTConfig(**ckpt["model_args"]))
model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
model.eval()
ids = np.fromfile("data/shakespeare_char/val.bin", dtype=np.uint16)
ids = torch.from_numpy(ids.astype(np.int64))
block = ckpt["model_args"]["block_size"]
n = (len(ids) - 1) // block
x, y = ids[:n * block].view(n, block), ids[1:n * block + 1].view(n, block)
with torch.no_grad():
    total = sum(model(x[i:i + 256], y[i:i + 256])[1].item() * len(x[i:i + 256])
                for i in range(0, n, 256))
print(total / n)
"""


def nanogpt_data(dest: Path, source: Path = TEXT) -> None:
    """`source` (tinyshakespeare) as nanoGPT's shakespeare_char/prepare.py writes it: uint16 ids
    of the sorted characters, the first 90 % in train.bin, the rest in val.bin, and meta.pkl."""
    text = source.read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    ids = np.array([stoi[ch] for ch in text], dtype=np.uint16)
    cut = int(len(text) * 0.9)
    ids[:cut].tofile(dest / "train.bin")
    ids[cut:].tofile(dest / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    (dest / "meta.pkl").write_bytes(pickle.dumps(meta))


def run_nanogpt(clone: Path, iters: int | None = None, score: bool = False,
                text: Path = TEXT) -> dict:
    """nanoGPT's CPU recipe on `text` from a copy of `clone` (with `iters`: its max_iters and
    lr_decay_iters): the wall time of its last eval line from launch, its val loss there, its
    best, the median time of the later half of its steps (`step_s`), its whole run's wall time
    and the curve; with `score`, `full_val` (`SCORE`)."""
    recipe = RECIPE if iters is None else [
        *(a for a in RECIPE if not a.startswith(("--max_iters", "--lr_decay_iters"))),
        f"--max_iters={iters}", f"--lr_decay_iters={iters}"]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "nanoGPT"
        shutil.copytree(clone, repo, ignore=shutil.ignore_patterns(".git"))
        nanogpt_data(repo / "data" / "shakespeare_char", text)
        cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", *recipe]
        steps: list[float] = []
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            curve = []
            for line in proc.stdout:
                if match := ITER_LINE.match(line):
                    steps.append(float(match[2]) / 1000)
                if match := EVAL_LINE.match(line):
                    curve.append({"step": int(match[1]),
                                  "wall_s": round(time.perf_counter() - t0, 2),
                                  "val_loss": float(match[3])})
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait()
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not curve:
            raise SystemExit(f"error: nanoGPT failed ({proc.returncode}); its command: "
                             f"{' '.join(cmd)}")
        full_val = score_nanogpt(repo) if score else None
    return {"seconds": curve[-1]["wall_s"], "final_val": curve[-1]["val_loss"],
            "best_val": min(e["val_loss"] for e in curve),
            "step_s": statistics.median(steps[len(steps) // 2:]) if steps else None,
            "total_wall_s": round(wall, 2), "curve": curve, "full_val": full_val}


def score_nanogpt(repo: Path) -> float:
    """`SCORE` in nanoGPT's copy `repo`, after its run."""
    if not (repo / "out-shakespeare-char" / "ckpt.pt").is_file():
        raise SystemExit("error: nanoGPT kept no ckpt.pt to score: its run ended before its "
                         "first eval after step 0 (every 250 steps); give it a longer budget")
    done = subprocess.run([sys.executable, "-c", SCORE], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: scoring nanoGPT's ckpt.pt failed: {done.stderr.strip()[-500:]}")
    return round(float(done.stdout.split()[-1]), 4)  # after its "number of parameters" line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("configs", nargs="*", metavar="CONFIG",
                        default=[str(ROOT / "configs" / name) for name in PRESETS],
                        help="configs to time, or `defaults` (default: the two CPU presets)")
    parser.add_argument("--target", type=positive(float),
                        help="the val loss to reach (default: a preset's own)")
    parser.add_argument("--nanogpt", type=Path, metavar="DIR",
                        help="a clone of karpathy/nanoGPT, to run beside the configs")
    parser.add_argument("--nanogpt-seconds", type=positive(float), metavar="SECONDS",
                        help="nanoGPT's time from an earlier run here, instead of running it")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a config override for every config")
    parser.add_argument("--max-seconds", type=positive(float),
                        help="end a run after this wall time from launch, reached or not")
    parser.add_argument("--full", action="store_true",
                        help="run each config to its end instead of stopping at the target")


def figures(args: argparse.Namespace) -> Iterator[dict]:
    """The figures of `args`: the configs, targets and clone checked now (a bad --set is said
    before nanoGPT's minutes), the runs made as iterated."""
    runs = []
    for config in args.configs:
        name = "defaults" if config == "defaults" else Path(config).name
        target, goal = PRESETS.get(name, (None, None))
        target = args.target or target
        if target is None:
            raise CharlmError(f"{config} has no target val loss of its own; give --target")
        load_config(None if config == "defaults" else config, args.overrides)
        runs.append((None if config == "defaults" else config, name, target, goal))
    if args.nanogpt and not (args.nanogpt / "train.py").is_file():
        raise CharlmError(f"--nanogpt {args.nanogpt} must name a clone of karpathy/nanoGPT "
                          "(or give --nanogpt-seconds)")
    return measure(runs, args)


def measure(runs: list, args: argparse.Namespace) -> Iterator[dict]:
    for r in range(1, args.rounds + 1):
        reference = None
        if args.nanogpt_seconds:
            reference = {"seconds": args.nanogpt_seconds, "given": True}
        elif args.nanogpt:
            reference = run_nanogpt(args.nanogpt)
        if reference:
            yield {"variant": "nanoGPT", "round": r, **reference}
        limit = args.max_seconds or (1.5 * reference["seconds"] if reference else 300.0)
        for config, name, target, goal in runs:
            result = time_to_loss(config, args.overrides, target, not args.full, limit)
            yield {"variant": name, "round": r, "target": target, "goal": goal, **result}


BENCH = Bench("presets", __doc__, add_arguments, figures, case=(), metric="seconds",
              metrics=("final_val",), rounds=1)
