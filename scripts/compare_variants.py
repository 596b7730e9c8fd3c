"""Train each single-option architecture change against the default for the same wall time and
print a markdown table: variant, parameters, tokens/s, val loss at equal time.

    python scripts/compare_variants.py [--seconds 30] [--config CONFIG]

Every variant gets the recipe of CONFIG (model size, batch, optimizer, seed; default: the built-in
defaults, GPT-2's architecture at the CPU preset's shape) with one `model` key changed (a relative
`data.path` of CONFIG is taken from the current directory, as `charlm train` takes it). Training
stops when the wall-time budget is spent; the learning-rate schedule (warmup, cosine) is stretched
over that budget instead of over `train.max_iters`, so a faster variant is not cut off mid-decay.
The variants take turns in `--rounds` slices of their budget, so load from other processes falls on
all of them alike. The val loss (nats/char) is then measured on the same fixed val windows for
every variant; evaluation time is not counted. The script ends after about the number of variants
times --seconds, plus building the models and the final evaluations, on any CPU. Timings depend on
the machine (its facts are printed first: CPU model, cores, torch threads and version) and on what
else runs on it: compare figures from one run only.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from common import machine_facts, machine_line, positive, run_script, summary

from charlm.config.loading import load_config
from charlm.config.schema import MODEL_VARIANTS, RunConfig
from charlm.data.batches import BatchSampler
from charlm.data.dataset import Dataset, dataset_for
from charlm.model.gpt import GPT
from charlm.runtime.device import resolve_device, seed_everything
from charlm.runtime.precision import grad_scaler, resolve_dtype
from charlm.training.loop import lr_at, train_step
from charlm.training.optimizer import make_optimizer
from charlm.training.tasks import TextTask
from charlm.training.validation import evaluate

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = MODEL_VARIANTS  # name -> the one model key it changes


def with_model(cfg: RunConfig, change: dict) -> RunConfig:
    raw = cfg.to_dict()
    raw["model"].update(change)
    return RunConfig.from_dict(raw, "compare_variants")


class Contender:
    """One variant's model, optimizer and sampler, trained in slices until its budget is spent."""

    def __init__(self, cfg: RunConfig, data: Dataset, seconds: float):
        tc = cfg.train
        self.cfg, self.data, self.seconds = cfg, data, seconds
        self.device = resolve_device(tc.device)
        self.dtype = resolve_dtype(tc.dtype, self.device)
        seed_everything(tc.seed)
        self.model = GPT(cfg.model, len(data.vocab)).to(self.device).train()
        self.optimizer = make_optimizer(self.model, cfg.optim)
        self.scaler = grad_scaler(self.device, self.dtype)
        self.sampler = BatchSampler(data.train, cfg.model.block_size, tc.batch_size, self.device,
                                    tc.seed)
        self.spent, self.steps = 0.0, 0

    def train_until(self, budget: float) -> None:
        """Train until `budget` seconds of wall time have been spent on this variant in all."""
        tc = self.cfg.train
        start, before = time.perf_counter(), self.spent
        while self.spent < min(budget, self.seconds):
            # The schedule's "step" is the fraction of the budget spent, in units of max_iters.
            at = int(self.spent / self.seconds * tc.max_iters)
            for group in self.optimizer.param_groups:
                group["lr"] = lr_at(at, self.cfg.optim, tc.max_iters)
            train_step(self.model, self.optimizer, self.scaler, self.sampler, self.cfg,
                       self.device, self.dtype)
            if self.device.type == "cuda":  # the clock must see the work, not its queueing
                torch.cuda.synchronize()
            self.steps += 1
            self.spent = before + time.perf_counter() - start

    def result(self) -> dict:
        tc = self.cfg.train
        tokens = self.steps * tc.batch_size * tc.grad_accum * self.cfg.model.block_size
        val = evaluate(self.model, TextTask(self.cfg, self.data), self.device,
                       self.dtype)["val"]
        return {"params": sum(p.numel() for p in self.model.parameters()), "steps": self.steps,
                "tokens_per_s": tokens / self.spent, "val_loss": val}



def main() -> None:
    parser = argparse.ArgumentParser(description=summary(__doc__))
    parser.add_argument("--seconds", type=positive(float), default=30.0,
                        help="training wall time per variant (default 30)")
    parser.add_argument("--config", type=Path, default=None,
                        help="the recipe every variant shares (default: the built-in defaults)")
    parser.add_argument("--eval-iters", type=int, default=50,
                        help="val batches in the final evaluation (default 50)")
    parser.add_argument("--rounds", type=positive(int), default=10,
                        help="slices each variant's time is cut into, taken in turn (default 10)")
    parser.add_argument("--only", nargs="+", choices=list(VARIANTS), metavar="VARIANT",
                        help="run only these variants (default: all)")
    args = parser.parse_args()
    base = load_config(args.config, [f"train.eval_iters={args.eval_iters}"])
    names = args.only or list(VARIANTS)
    source = Path(base.data.path)
    if args.config is None:  # the built-in defaults' data is the repo's, wherever this runs from
        source = ROOT / source
    with tempfile.TemporaryDirectory() as tmp:
        data = dataset_for(str(source), base.data.val_fraction, Path(tmp) / "dataset")
        device = resolve_device(base.train.device)
        load = os.getloadavg()[0]
        recipe = args.config.name if args.config else "the built-in defaults"
        print(machine_line(machine_facts()))
        print(f"{args.seconds:g} s of training per variant, {recipe}, device {device}\n")
        contenders = {n: Contender(with_model(base, VARIANTS[n]), data, args.seconds)
                      for n in names}
        # Round-robin slices: load from other processes that comes and goes then hits every
        # variant alike, instead of whichever one happened to be running.
        for r in range(1, args.rounds + 1):
            for c in contenders.values():
                c.train_until(args.seconds * r / args.rounds)
        print("| variant | params | tokens/s | steps | val loss | vs default |")
        print("|---|---:|---:|---:|---:|---:|")
        results = {n: c.result() for n, c in contenders.items()}
        reference = results.get("default", {}).get("val_loss")
        for name, r in results.items():
            delta = f"{r['val_loss'] - reference:+.3f}" if reference is not None else ""
            print(f"| {name} | {r['params']:,} | {r['tokens_per_s']:,.0f} | {r['steps']} | "
                  f"{r['val_loss']:.3f} | {delta} |")
        print(f"\nload average before / after: {load:.2f} / {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    run_script(main)
