"""Train each single-option architecture change against the default for the same wall time and
print a markdown table: variant, parameters, tokens/s, val loss at equal time.

    python scripts/compare_variants.py [--seconds 30] [--config configs/shakespeare_char_cpu.yaml]

Every variant gets the config's recipe (model size, batch, optimizer, seed) with one `model` key
changed. Training stops when the wall-time budget is spent; the learning-rate schedule (warmup,
cosine) is stretched over that budget instead of over `train.max_iters`, so a faster variant is
not cut off mid-decay. The val loss (nats/char) is then measured on the same fixed val windows
for every variant; evaluation time is not counted. Timings depend on the machine and on what
else runs on it: compare figures from one run only.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from charlm.config import RunConfig, load_config
from charlm.data import BatchSampler, Dataset, dataset_for
from charlm.device import grad_scaler, resolve_device, resolve_dtype, seed_everything
from charlm.model import GPT
from charlm.train import evaluate, lr_at, make_optimizer, train_step

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {  # name -> the one model key it changes
    "default": {},
    "pos_encoding=sinusoidal": {"pos_encoding": "sinusoidal"},
    "pos_encoding=rope": {"pos_encoding": "rope"},
    "pos_encoding=none": {"pos_encoding": "none"},
    "norm=rmsnorm": {"norm": "rmsnorm"},
    "norm_placement=post": {"norm_placement": "post"},
    "activation=relu": {"activation": "relu"},
    "activation=swiglu": {"activation": "swiglu"},
    "tie_weights=false": {"tie_weights": False},
    "bias=true": {"bias": True},
}


def with_model(cfg: RunConfig, change: dict) -> RunConfig:
    raw = cfg.to_dict()
    raw["model"].update(change)
    return RunConfig.from_dict(raw, "compare_variants")


def run_variant(cfg: RunConfig, data: Dataset, seconds: float) -> dict:
    """Train a fresh model of `cfg` for `seconds` of wall time; its size, speed and val loss."""
    tc = cfg.train
    device = resolve_device(tc.device)
    dtype = resolve_dtype(tc.dtype, device)
    seed_everything(tc.seed)
    model = GPT(cfg.model, len(data.vocab)).to(device)
    optimizer = make_optimizer(model, cfg.optim, device)
    scaler = grad_scaler(device, dtype)
    sampler = BatchSampler(data.train, cfg.model.block_size, tc.batch_size, device, tc.seed)
    model.train()
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        # The schedule's "step" is the fraction of the budget spent, in units of max_iters.
        lr = lr_at(int(elapsed / seconds * tc.max_iters), cfg.optim, tc.max_iters)
        for group in optimizer.param_groups:
            group["lr"] = lr
        train_step(model, optimizer, scaler, sampler, cfg, device, dtype)
        if device.type == "cuda":  # the clock must see the work, not its queueing
            torch.cuda.synchronize()
        steps += 1
    elapsed = time.perf_counter() - start
    tokens = steps * tc.batch_size * tc.grad_accum * cfg.model.block_size
    val = evaluate(model, data, cfg, device, dtype)["val"]
    return {"params": sum(p.numel() for p in model.parameters()), "steps": steps,
            "tokens_per_s": tokens / elapsed, "val_loss": val}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="training wall time per variant (default 30)")
    parser.add_argument("--config", type=Path, default=ROOT / "configs" /
                        "shakespeare_char_cpu.yaml", help="the recipe every variant shares")
    parser.add_argument("--eval-iters", type=int, default=50,
                        help="val batches in the final evaluation (default 50)")
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), metavar="VARIANT",
                        help="run only these variants (default: all)")
    args = parser.parse_args()
    base = load_config(args.config, [f"train.eval_iters={args.eval_iters}"])
    names = args.only or list(VARIANTS)
    source = Path(base.data.path)
    source = source if source.is_absolute() else ROOT / source
    with tempfile.TemporaryDirectory() as tmp:
        data = dataset_for(str(source), base.data.val_fraction, Path(tmp) / "dataset")
        device = resolve_device(base.train.device)
        print(f"{args.seconds:g} s of training per variant, {args.config.name}, device {device}, "
              f"{torch.get_num_threads()} torch threads, torch {torch.__version__}\n")
        print("| variant | params | tokens/s | steps | val loss | vs default |")
        print("|---|---:|---:|---:|---:|---:|")
        reference = None
        for name in names:
            r = run_variant(with_model(base, VARIANTS[name]), data, args.seconds)
            if name == "default":
                reference = r["val_loss"]
            delta = f"{r['val_loss'] - reference:+.3f}" if reference is not None else ""
            print(f"| {name} | {r['params']:,} | {r['tokens_per_s']:,.0f} | {r['steps']} | "
                  f"{r['val_loss']:.3f} | {delta} |", flush=True)


if __name__ == "__main__":
    main()
