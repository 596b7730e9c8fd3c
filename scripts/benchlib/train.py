"""`bench.py train`: training throughput (ms a step, tokens/s, MFU) of one config or of variants
of it, and with --eval-iters their val loss after equal training: steps, or wall time.

Each variant builds what `charlm train` builds for its config (model, the compiled step where
`train.compile` says so, AdamW, scaler, batch sampler, autocast) on the config's data (a text
file is prepared into a temporary directory, removed at the end), trains --warmup steps untimed,
then in every round --steps steps, or fewer once --seconds have passed (one at least), the
variants in turn, so load that comes and goes falls on all of them alike. The learning-rate
schedule (warmup, cosine) spans the rounds' budget (their steps, or their seconds, whichever
runs out first) instead of `train.max_iters`, so a faster variant is not cut off mid-decay.
With --eval-iters N each variant's val loss is then measured on the same N val batches, not
timed.

A variant (--variants) is a name of `MODEL_VARIANTS` (`default`, `activation=swiglu`, ...: one
model key changed; `all` stands for every one of them) or overrides
`section.key=value[,section.key=value ...]` (`train.dtype=bfloat16`). FLOPs per token follow
the PaLM appendix (6N + 12 * n_layer * n_embd * block_size, `charlm info`); MFU is against the
peak of `benchlib.peak`, and on a CPU against the float32 peak too."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from common import positive

from benchlib.harness import ROOT, Bench, interleave
from benchlib.peak import peaks
from charlm.config.loading import load_config
from charlm.config.schema import MODEL_VARIANTS, RunConfig
from charlm.core.errors import CharlmError
from charlm.data.batches import BatchSampler
from charlm.data.dataset_dir import Dataset
from charlm.data.datasets import dataset_for
from charlm.data.sources import check_source_file
from charlm.info.parameters import flops_per_token, parameter_table
from charlm.model.gpt import GPT
from charlm.runtime.device import resolve_device, seed_everything
from charlm.runtime.precision import compile_model, grad_scaler, resolve_dtype
from charlm.runtime.profile import Machine, pick_dtype
from charlm.training.evaluation import evaluate
from charlm.training.loop import train_step
from charlm.training.optimizer import WeightAverage, make_optimizer, set_lr
from charlm.training.schedule import Schedule
from charlm.training.tasks import TextTask


def variant_overrides(spec: str) -> list[str]:
    """The `--set` overrides a variant stands for."""
    if spec in MODEL_VARIANTS:
        return [f"model.{key}={value}" for key, value in MODEL_VARIANTS[spec].items()]
    parts = re.split(r",(?=[\w.]+=)", spec)
    if not all(re.fullmatch(r"\w+\.\w+=.*", part) for part in parts):
        raise CharlmError(f"variant {spec!r} is neither one of {', '.join(MODEL_VARIANTS)} nor "
                          "section.key=value[,section.key=value]; give one of those")
    return parts


class Contender:
    """One variant's run objects, trained in slices; `progress` places it in the schedule."""

    def __init__(self, cfg: RunConfig, data: Dataset, planned_steps: int, planned_s: float):
        tc = cfg.train
        self.cfg, self.planned_steps, self.planned_s = cfg, planned_steps, planned_s
        self.device = resolve_device(tc.device)
        self.dtype = resolve_dtype(pick_dtype(tc.dtype, self.device, Machine())[0], self.device)
        seed_everything(tc.seed)
        self.model = GPT(cfg.model, len(data.vocab)).to(self.device).train()
        self.step_model = self.model
        if tc.compile:
            example = tuple(torch.zeros(tc.batch_size, cfg.model.block_size, dtype=torch.long,
                                        device=self.device) for _ in "xy")
            self.step_model, failure = compile_model(self.model, example, self.device,
                                                     self.dtype)
            if failure:
                print(f"warning: torch.compile failed ({failure}); timing without compile",
                      file=sys.stderr)
        self.optimizer = make_optimizer(self.model, cfg.optim)
        self.average = WeightAverage(self.model, cfg.optim.ema) if cfg.optim.ema else None
        self.scaler = grad_scaler(self.device, self.dtype)
        self.sampler = BatchSampler(data.train, cfg.model.block_size, tc.batch_size,
                                    self.device, tc.seed)
        self.task = TextTask(cfg, data)
        self.steps, self.spent = 0, 0.0
        self.schedule = Schedule(cfg.optim, dataclasses.replace(tc, max_time=None))
        self.tokens_per_step = tc.batch_size * tc.grad_accum * cfg.model.block_size
        self.flops = flops_per_token(parameter_table(self.model), cfg.model,
                                     len(data.vocab))["training"]

    def progress(self) -> float:
        """The share of the planned budget spent: of its steps, or of its seconds."""
        return max(self.steps / self.planned_steps, self.spent / self.planned_s)

    def train(self, steps: int, seconds: float) -> tuple[int, float]:
        """(steps run, seconds): `steps` steps, or fewer once `seconds` have passed."""
        max_iters = self.cfg.train.max_iters
        t = time.perf_counter()
        done = 0
        while done < steps and (done == 0 or time.perf_counter() - t < seconds):
            lr = self.schedule.lr(int(min(self.progress(), 1.0) * max_iters))
            set_lr(self.optimizer, lr, self.cfg.optim)  # Muon's as its share of its peak
            loss, _, _ = train_step(self.step_model, self.optimizer, self.scaler, self.sampler,
                                    self.cfg, self.device, self.dtype)
            if self.average is not None:
                self.average.update(self.model)
            done += 1
            self.steps += 1
        loss.item()  # wait for the device
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t
        self.spent += elapsed
        return done, elapsed

    def facts(self) -> dict:
        return {"params": sum(p.numel() for p in self.model.parameters()),
                "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                "compile": self.step_model is not self.model, "threads": torch.get_num_threads(),
                "tokens_per_step": self.tokens_per_step, "flops_per_token": self.flops}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?",
                        help="the recipe every variant shares (default: the built-in defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a config override for every variant")
    parser.add_argument("--variants", nargs="+", default=["default"], metavar="VARIANT",
                        help="what to time, in this order: MODEL_VARIANTS names, `all` of "
                        "them, or section.key=value[,...] (default: default, the config as is)")
    parser.add_argument("--steps", type=positive(int), default=10,
                        help="steps of each variant in a round (default 10)")
    parser.add_argument("--seconds", type=positive(float), default=30.0,
                        help="end a variant's round, and its warm-up, after this many seconds, "
                        "one step at least (default 30)")
    parser.add_argument("--warmup", type=positive(int, zero=True), default=10,
                        help="untimed steps of each variant first (default 10)")
    parser.add_argument("--eval-iters", type=positive(int, zero=True), default=0,
                        help="then measure each variant's val loss over this many batches "
                        "(default 0: none)")


def variant_configs(args: argparse.Namespace) -> dict[str, RunConfig]:
    """Each variant's config, in the order given, `all` spelled out, each variant once."""
    evals = [f"train.eval_iters={args.eval_iters}"] if args.eval_iters else []
    specs = [name for spec in args.variants
             for name in (MODEL_VARIANTS if spec == "all" else [spec])]
    return {spec: load_config(args.config, [*args.overrides, *evals, *variant_overrides(spec)])
            for spec in dict.fromkeys(specs)}


def figures(args: argparse.Namespace) -> Iterator[dict]:
    """The training figures of `args`: the configs are read now, the training done as
    iterated."""
    cfgs = variant_configs(args)
    source = Path(next(iter(cfgs.values())).data.path)
    if args.config is None:  # the built-in defaults' data is the repo's, wherever this runs from
        source = ROOT / source
    if not source.is_dir():
        check_source_file(source)
    return measure(cfgs, source, args)


def measure(cfgs: dict[str, RunConfig], source: Path,
            args: argparse.Namespace) -> Iterator[dict]:
    base = next(iter(cfgs.values()))
    name = Path(args.config).name if args.config else "defaults"
    with tempfile.TemporaryDirectory() as tmp:  # a text file is prepared here, not left behind
        data = dataset_for(source, base.data.val_fraction, Path(tmp) / "dataset")
        contenders = {spec: Contender(cfg, data, args.rounds * args.steps,
                                      args.rounds * args.seconds) for spec, cfg in cfgs.items()}
        device = next(iter(contenders.values())).device
        peak, fp32, peak_facts = peaks(device)
        for spec, c in contenders.items():
            warmed = c.train(args.warmup, args.seconds)[0] if args.warmup else 0
            c.steps, c.spent = 0, 0.0  # the schedule spans the timed rounds
            yield {"config": name, "variant": spec, **c.facts(), "warmup_steps": warmed,
                   **peak_facts}

        def runner(c: Contender):
            def run() -> dict:
                steps, seconds = c.train(args.steps, args.seconds)
                tokens_per_s = steps * c.tokens_per_step / seconds
                achieved = tokens_per_s * c.flops
                return {"steps": steps, "ms_per_step": round(1000 * seconds / steps, 2),
                        "tokens_per_s": round(tokens_per_s),
                        "achieved_tflops": round(achieved / 1e12, 4),
                        "mfu": round(achieved / peak, 4) if peak else None,
                        "mfu_vs_fp32_peak": round(achieved / fp32, 4) if fp32 else None}
            return run

        runners = {spec: runner(c) for spec, c in contenders.items()}
        for figure in interleave(runners, args.rounds):
            yield {"config": name, **figure}
        if not args.eval_iters:
            return
        for spec, c in contenders.items():
            shown = c.model if c.average is None else c.average.module  # as `charlm train`'s
            val = evaluate(shown, c.task, c.device, c.dtype)["val"]
            yield {"config": name, "variant": spec, "steps": c.steps,
                   "train_seconds": round(c.spent, 2), "val_loss": round(val, 4)}


BENCH = Bench("train", __doc__, add_arguments, figures, case=("config",), metric="tokens_per_s",
              metrics=("ms_per_step", "mfu"), rounds=5)
