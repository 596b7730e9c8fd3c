"""A training run's objects: `TrainState`, the `Run` that `build_run` makes alike for a fresh and
a resumed run (which then loads `Run.stateful` from `last.pt`), and its files (`RunFiles`)."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from charlm.config.data import DataConfig
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError, warn
from charlm.data.batches import BatchSampler, PairBatchSampler
from charlm.data.dataset_dir import dataset_meta
from charlm.data.datasets import prepared_dir
from charlm.data.sources import missing_inputs
from charlm.model import footprint
from charlm.runtime.device import require_memory
from charlm.runtime.distributed import Dist
from charlm.runtime.precision import compile_model, grad_scaler
from charlm.training import faults, schedule, sizing
from charlm.training.checkpoint import Entry, RNGState, Stateful, load_scaler, saved_section
from charlm.training.evaluation import eval_batches_per_forward
from charlm.training.metrics import MetricsLogger
from charlm.training.optimizer import Optimizer, WeightAverage, load_state, make_optimizer
from charlm.training.parent import Parent, base_vocab, init_from_parent
from charlm.training.run_dir import clear_run, start_run
from charlm.training.tasks import PairsTask, Task, build_model, task_for


@dataclass
class TrainState:
    """What a run has done so far; saved in every checkpoint as "train_state"."""

    step: int = 0  # training steps done, skipped updates included (the schedule moves on)
    best_val: float = math.inf
    tokens: int = 0  # training tokens consumed
    elapsed_s: float = 0.0  # wall time spent in train(), summed over resumes
    budget_steps: int | None = None  # the step a time budget ended the run at (None: not yet)
    eval_due: bool = False  # a stop signal cut the eval of `step` short: a resume runs it first
    bad: faults.BadSteps = field(default_factory=faults.BadSteps, repr=False, compare=False)

    def state_dict(self) -> dict[str, Any]:
        # saved only when set, so that the layout of other checkpoints stays version 1's
        budget = {} if self.budget_steps is None else {"budget_steps": self.budget_steps}
        due = {"eval_due": True} if self.eval_due else {}
        return {"step": self.step, "best_val": self.best_val, "tokens": self.tokens,
                "elapsed_s": self.elapsed_s, **budget, **due, **self.bad.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("step", "best_val", "tokens", "elapsed_s", "eval_due", "budget_steps"):
            setattr(self, name, state.get(name, getattr(TrainState, name)))  # older: default
        if self.budget_steps != self.step:  # an older version's planned steps, still ahead
            self.budget_steps = None
        self.bad.load_state_dict(state)


def require_batch_memory(task: Task, device: torch.device, dtype: torch.dtype, rows: int) -> None:
    """Refuse a model whose float32 weights, gradients and AdamW moments (16 bytes a parameter)
    alone exceed the device's memory, then a micro-batch of `rows` whose activations do with
    them (an eval forward of the same rows needs less)."""
    params = task.parameter_count()
    require_memory(16 * params, device,
                   f"the model has {params:,} parameters, whose weights, gradients and AdamW "
                   "state need {gib}", "make model.n_layer or model.n_embd smaller")
    m = task.cfg.model
    vocab = task.vocab.target_size if m.arch == "encoder_decoder" else len(task.vocab)
    need = footprint.training_bytes(m, vocab, rows, dtype, device) + 16 * params
    require_memory(need, device,
                   f"a batch of {rows:,} x {m.block_size} needs about {{gib}} for its "
                   "activations in training (with the model's weights, gradients and AdamW "
                   "state)", "lower train.batch_size (raising train.grad_accum keeps the tokens "
                   "per step) or model.block_size")


@dataclass
class Run:
    """A run's objects, built once by `build_run` (the wrappers by `wrap_model`)."""

    cfg: RunConfig
    dist: Dist
    device: torch.device
    dtype: torch.dtype
    task: Task  # the data and what goes with it (text for a GPT, pairs for an encoder-decoder)
    sampler: BatchSampler | PairBatchSampler
    model: torch.nn.Module  # unwrapped and uncompiled: what checkpoints save and previews use
    optimizer: Optimizer  # AdamW, or Muon with AdamW (`optim.name`)
    scaler: torch.amp.GradScaler
    state: TrainState
    step_model: torch.nn.Module  # what train_step calls: `model`, compiled and / or in DDP
    eval_model: torch.nn.Module  # what evaluate calls
    eval_group: int = 1  # eval batches per forward
    average: WeightAverage | None = None  # `optim.ema`'s, which evals and checkpoints show

    @property
    def weights(self) -> torch.nn.Module:
        """The model the run shows (evals, samples, a checkpoint's "model")."""
        return self.model if self.average is None else self.average.module

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.train.out_dir)

    def stateful(self) -> dict[str, Stateful]:
        """Everything a checkpoint saves and a resume loads, under its name in the file."""
        averaged: dict[str, Stateful] = {} if self.average is None else {
            "train_model": self.model, "average": self.average}
        return {"model": self.weights, **averaged,
                "optimizer": Entry(self.optimizer.state_dict, partial(load_state, self.optimizer)),
                "scaler": Entry(self.scaler.state_dict, partial(load_scaler, self.scaler)),
                "train_state": self.state, "sampler": self.sampler, "rng": RNGState(self.device)}


@dataclass
class RunFiles:
    """A run's config.yaml and log, opened by the first `open`: a resume's at once, a fresh
    run's once its first step has run (see `loop._train`)."""

    run: Run
    clock: schedule.Clock
    overwrite: bool  # a fresh run over a previous one: clear it when opening
    start_step: int  # the step the run starts from (0, or the resumed checkpoint's)
    progress: bool | None
    intro: str  # said once the log opens: what the run computes with
    log: MetricsLogger | None = None

    def open(self) -> MetricsLogger:
        """The run's log, its files opened at the first call (on every rank at the same step;
        not training time, for tokens/s), with a time budget's deadline for the progress bar."""
        if self.log is not None:
            return self.log
        run, dist, clock, tc = self.run, self.run.dist, self.clock, self.run.cfg.train
        t_open = clock.now()
        with dist.main_first():
            if dist.is_main:
                if self.overwrite:
                    clear_run(run.run_dir)
                start_run(run.run_dir, run.cfg)
            self.log = MetricsLogger(run.run_dir, tc.max_iters if tc.max_time is None else None,
                                     self.start_step, self.progress, enabled=dist.is_main)
        self.log.message(self.intro)
        if tc.max_time is not None:
            self.log.set_deadline(clock.start + tc.max_time - clock.before, clock.now)
        clock.pause(t_open)
        return self.log

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def require_same_vocab(ckpt: dict[str, Any] | None, data_path: str, vocab: Any) -> None:
    """`vocab`: as a checkpoint stores it."""
    if ckpt is not None and ckpt.get("vocab") != vocab:
        raise CharlmError(
            f"--resume: the vocabulary of {data_path} differs from the run's checkpoint; "
            "resume with the data the run was started on")


def warn_about_config(cfg: RunConfig, task: Task, dist: Dist) -> None:
    """Warn (rank 0) about settings that do not do what they seem to."""
    prepared_with = task.data.meta.get("val_fraction")
    set_by_user = cfg.data.val_fraction != DataConfig.val_fraction  # the default says nothing
    if (prepared_dir(cfg.data) is not None and set_by_user
            and prepared_with != cfg.data.val_fraction and dist.is_main):
        warn(f"data.val_fraction={cfg.data.val_fraction} does not apply to the "
             f"prepared dataset {cfg.data.shown}, whose split was made with --val-fraction "
             f"{prepared_with}; run `charlm prepare` again to change it")
    if (cfg.train.max_time is None  # a budget's steps are not known
            and cfg.optim.warmup_iters >= cfg.train.max_iters and dist.is_main):
        warn(f"optim.warmup_iters={cfg.optim.warmup_iters} is not below "
             f"train.max_iters={cfg.train.max_iters}: the learning rate never reaches "
             f"optim.lr={cfg.optim.lr:g}; lower optim.warmup_iters to train at full rate")


def source_hashes(meta: dict[str, Any]) -> list[Any] | None:
    """The sha256 of each text a dataset's meta.json says it was made from (None if damaged)."""
    sources = meta.get("sources")
    if not isinstance(sources, list) or not all(isinstance(s, dict) for s in sources):
        return None
    return [s.get("sha256") for s in sources]


def warn_about_split(ckpt: dict[str, Any] | None, cfg: RunConfig, task: Task,
                     before: dict[str, Any] | None, dist: Dist) -> None:
    """Warn (rank 0) when a resumed run's validation split may not be the one its best val loss
    was measured on: a split fraction differs from the checkpoint's, or the text from the one
    the run's dataset cache was made from (`before`: its meta.json before this resume)."""
    # read with care: the checkpoint is checked only when it is restored, after this
    state, config = (ckpt.get("train_state"), ckpt.get("config")) if ckpt else (None, None)
    best = state.get("best_val") if isinstance(state, dict) else None
    if (not dist.is_main or not isinstance(best, (int, float)) or not math.isfinite(best)
            or not isinstance(config, dict) or prepared_dir(cfg.data) is not None):
        return  # nothing to compare with yet; a prepared dataset dir has its split fixed
    saved = saved_section(ckpt, "data")
    keys = ("val_fraction", "test_fraction") if isinstance(task, PairsTask) else ("val_fraction",)
    reasons = [f"data.{key} {saved.get(key, getattr(DataConfig, key))} -> "
               f"{getattr(cfg.data, key)}" for key in keys
               if saved.get(key, getattr(DataConfig, key)) != getattr(cfg.data, key)]
    certain = bool(reasons)
    old = source_hashes(before) if before is not None else None
    if old is not None and old != source_hashes(task.data.meta):
        reasons.append(f"{cfg.data.shown} is not the text the run's dataset cache was made from")
    if reasons:
        warn(f"--resume: the validation split {'' if certain else 'may have '}changed "
             f"({'; '.join(reasons)}): val losses from here on "
             f"{'are not' if certain else 'may not be'} comparable with the run's best "
             f"{best:.4f} so far, and best.pt is replaced only by an eval whose val loss is "
             "below it")


def build_run(cfg: RunConfig, dist: Dist, device: torch.device, dtype: torch.dtype,
              ckpt: dict[str, Any] | None, parent: Parent | None = None,
              size: Collection[str] | None = None) -> Run:
    """Build a run's objects (`ckpt`, whose state is loaded afterwards, is only checked against
    the data's vocabulary); `parent`, `size`: as for `loop.train`."""
    same_vocab = partial(require_same_vocab, ckpt, cfg.data.shown)
    cache = Path(cfg.train.out_dir) / "dataset"
    before = dataset_meta(cache) if ckpt is not None and dist.is_main else None
    if ckpt is not None and missing_inputs(cfg.data.inputs) and (cache / "meta.json").is_file():
        raise CharlmError(f"--resume: input file not found: {missing_inputs(cfg.data.inputs)[0]} "
                          f"(data.path), but the run's prepared copy is in {cache}; resume with "
                          f"--data {cache}")
    with dist.main_first():  # rank 0 prepares the dataset cache; the others then reuse it
        task = task_for(cfg, cache, same_vocab, base_vocab(cfg, ckpt, parent))
    if size is not None:
        cfg = sizing.size_model(cfg, size, task, dist, device, dtype)
        task = type(task)(cfg, task.data)
    same_vocab(task.vocab_state())  # also for a prepared dataset dir, or a reused cache
    warn_about_config(cfg, task, dist)
    warn_about_split(ckpt, cfg, task, before, dist)
    sampler = task.sampler("train", cfg.train.seed, device, rows=dist.rows(cfg.train.batch_size))
    require_batch_memory(task, device, dtype, len(range(sampler.batch_size)[sampler.rows]))
    model = build_model(cfg, task.vocab).to(device)
    if parent is not None and ckpt is None:
        init_from_parent(model, parent, task.vocab)
    average = WeightAverage(model, cfg.optim.ema) if cfg.optim.ema > 0 else None
    return Run(cfg, dist, device, dtype, task, sampler, model,
               optimizer=make_optimizer(model, cfg.optim), scaler=grad_scaler(device, dtype),
               state=TrainState(bad=faults.BadSteps(device)), step_model=model, eval_model=model,
               average=average)


def wrap_model(run: Run) -> None:
    """Compile (if asked) and DDP-wrap (if distributed) the model; pick how evals run."""
    tc, dist = run.cfg.train, run.dist
    rows = tc.batch_size // dist.world_size  # this rank's micro-batch
    compiled: torch.nn.Module = run.model
    if tc.compile:
        compiled, failure = compile_model(run.model, run.task.example_batch(rows, run.device),
                                          run.device, run.dtype)
        if failure and dist.is_main:
            warn(f"torch.compile failed ({failure}); training without compile")
    run.step_model = dist.wrap(compiled, run.device)  # `compiled` itself when not distributed
    run.eval_group = eval_batches_per_forward(run.cfg, run.task, run.device, rows)
    # Stacked eval batches have a shape the compiled graph was not built for: those run eagerly.
    run.eval_model = compiled if run.eval_group == 1 else run.model
    if run.average is not None:  # evals are the average's, uncompiled
        run.eval_model = run.average.module
