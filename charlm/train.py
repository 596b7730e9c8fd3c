"""Training: `TrainState`, `train(cfg)`, `train_step`, `evaluate` and the schedule `lr_at`.

Fresh and resumed runs build the same objects; a resume then loads model, optimizer, scaler,
train state, the batch sampler's generator and the torch RNG states from `last.pt`. `step` counts
training steps; a step whose loss or gradient norm is not finite skips its update. SIGINT /
SIGTERM finish the current step, save `last.pt` and raise `Interrupted` (see `charlm.faults`).

Under torchrun the same loop runs on every rank with DistributedDataParallel (see
`charlm.device.distributed`): each rank trains on its rows of the global batch that the
identically seeded sampler draws, so a step sees the batch a single-process run would; rank 0
alone logs, samples and writes. Every value that decides what the loop does next is the same on
all ranks: the loss (all-reduced), the gradient norm (of all-reduced gradients), hence `ok`, and
the stop signal, which one small host-side all-reduce per step agrees on. At log, eval and
checkpoint steps one more tells the other ranks that rank 0's writes went through, so a rank 0
that fails there (a full disk) does not leave them to die in a collective.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import math
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from charlm import checkpoint
from charlm.config import (
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    apply_overrides,
    load_config,
    save_config,
)
from charlm.data import BatchSampler, Dataset, dataset_for, require_window
from charlm.device import (
    Dist,
    autocast,
    compile_model,
    distributed,
    grad_scaler,
    require_memory,
    resolve_device,
    resolve_dtype,
    seed_everything,
    sync_grads,
)
from charlm.errors import CharlmError
from charlm.faults import BadSteps, Interrupted, StopSignals
from charlm.files import make_writable_dir, remove_temps
from charlm.generate import NonFiniteOutput
from charlm.metrics import MetricsLogger
from charlm.model import GPT, parameter_count
from charlm.optim import load_state, make_optimizer, step_if
from charlm.sampling import preview
from charlm.vocab import Vocab

LN2 = math.log(2)
RUN_FILES = ("last.pt", "best.pt", "metrics.jsonl", "tb", "config.yaml")


@dataclass
class TrainState:
    step: int = 0  # training steps done, skipped updates included (the schedule moves on)
    best_val: float = math.inf
    tokens: int = 0  # training tokens consumed
    elapsed_s: float = 0.0  # wall time spent in train(), summed over resumes
    skipped_steps: int = 0  # steps whose update was skipped for a non-finite loss or grad norm
    bad_streak: int = 0  # of those, how many in a row ended at `step` (max_bad_steps stops a run)

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for f in dataclasses.fields(self):  # a field added later takes its default
            setattr(self, f.name, state.get(f.name, f.default))


def lr_at(step: int, optim: OptimConfig, max_iters: int) -> float:
    """Linear warmup over `warmup_iters`, then cosine decay to `min_lr` at `lr_decay_iters`."""
    decay_iters = optim.lr_decay_iters or max_iters
    if step < optim.warmup_iters:
        return optim.lr * (step + 1) / (optim.warmup_iters + 1)
    if step >= decay_iters:
        return optim.min_lr
    ratio = (step - optim.warmup_iters) / max(decay_iters - optim.warmup_iters, 1)
    return optim.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (optim.lr - optim.min_lr)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, sampler: BatchSampler, cfg: RunConfig,
               device: torch.device, dtype: torch.dtype, dist: Dist = Dist(),
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer update over `grad_accum` micro-batches, skipped when the loss or the
    gradient norm is not finite. Returns (mean loss, grad norm, ok) as tensors, so a step that
    does not log never waits for the device. Under DDP the gradients are all-reduced on the last
    micro-batch only, and the loss is averaged over ranks (the global batch's)."""
    accum = cfg.train.grad_accum
    total = torch.zeros((), device=device)
    for i in range(accum):
        x, y = sampler.batch()
        with sync_grads(model, sync=i == accum - 1):
            with autocast(device, dtype):
                _, loss = model(x, y)
            loss = loss / accum
            scaler.scale(loss).backward()
        total += loss.detach()
    dist.mean_(total)
    scaler.unscale_(optimizer)
    clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    # The norm is taken after unscaling, so it is non-finite whenever GradScaler (fp16) would
    # skip the step: `ok` covers its check, and its update() still lowers the scale.
    ok = torch.isfinite(total) & torch.isfinite(norm)
    step_if(optimizer, ok)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total, norm, ok


def require_model_memory(model: ModelConfig, vocab_size: int, device: torch.device) -> None:
    """Refuse a model whose float32 weights, gradients and two AdamW moments (16 bytes a
    parameter, before any activation) alone exceed the device's memory: it could never train."""
    params = parameter_count(model, vocab_size)
    require_memory(16 * params, device,
                   f"the model has {params:,} parameters, whose weights, gradients and AdamW "
                   "state need {gib}", "make model.n_layer or model.n_embd smaller")


def eval_batches_per_forward(cfg: RunConfig, device: torch.device, vocab_size: int,
                             rows: int) -> int:
    """How many of the `eval_iters` batches (of `rows` rows each, this rank's) `evaluate` scores
    in one forward. 1 on the CPU and MPS (measured on the 2-core CPU: larger eval batches are no
    faster there). On CUDA, as many as fit in a quarter of the free memory, so an eval is a few
    large forwards instead of `eval_iters` small, launch-bound ones (nanoGPT's 200)."""
    if device.type != "cuda":
        return 1
    free, _ = torch.cuda.mem_get_info(device)
    return batches_that_fit(free // 4, cfg, vocab_size, rows)


def batches_that_fit(budget: int, cfg: RunConfig, vocab_size: int, rows: int) -> int:
    """Batches of `rows` rows whose no-grad forward fits in `budget` bytes, between 1 and
    `eval_iters`. A generous per-row estimate in float32: the MLP's hidden activations (up to
    4 F per position: SwiGLU's fc is 2 F wide), the logits three times over (bf16, the float32
    copy, log-softmax), 8 residual-width tensors, and an H x T x T attention matrix should SDPA
    take its math path."""
    m = cfg.model
    T = m.block_size
    per_row = 4 * T * (4 * m.ff_width + 3 * vocab_size + 8 * m.n_embd + m.n_head * T)
    return max(1, min(cfg.train.eval_iters, budget // (per_row * rows)))


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Dataset, cfg: RunConfig, device: torch.device,
             dtype: torch.dtype, dist: Dist = Dist(), batches_per_forward: int = 1,
             ) -> dict[str, float]:
    """Mean loss (nats/char) over `eval_iters` batches of each split.

    The batches come from a generator seeded afresh each time, so every evaluation of a run scores
    the same windows (comparable across evals) and the training RNG is left alone. Under DDP each
    rank scores its rows of those batches and the means are averaged over ranks.
    `batches_per_forward` (see `eval_batches_per_forward`) scores that many batches, stacked, in
    one forward: the same windows and the same mean, in fewer, larger forwards.
    """
    was_training = model.training
    model.eval()
    try:
        losses = {}
        iters = cfg.train.eval_iters
        for split in ("train", "val"):
            sampler = BatchSampler(data.split(split), cfg.model.block_size, cfg.train.batch_size,
                                   device, seed=cfg.train.seed + 1, name=split,
                                   rows=dist.rows(cfg.train.batch_size))
            total = torch.zeros((), device=device)
            for first in range(0, iters, batches_per_forward):
                n = min(batches_per_forward, iters - first)
                xs, ys = zip(*(sampler.batch() for _ in range(n)), strict=True)
                with autocast(device, dtype):
                    _, loss = model(torch.cat(xs), torch.cat(ys))  # the mean of n equal batches
                total += loss * n
            losses[split] = dist.mean_(total / iters).item()
        return losses
    finally:
        model.train(was_training)


def resume_config(run_dir: Path, config_path: str | Path | None,
                  overrides: list[str]) -> RunConfig:
    """The config of a resumed run: the checkpoint's (or CONFIG's) with overrides applied.

    The architecture comes from the checkpoint: an override or CONFIG that changes it is an error.
    """
    ckpt_path = run_dir / "last.pt"
    if ckpt_path.is_dir():  # not "no checkpoint": a fresh start would send the user back here
        raise CharlmError(f"--resume: {ckpt_path} is a directory, not a checkpoint; move it out "
                          "of the way, or start over with --overwrite")
    if not ckpt_path.exists():  # anything else that is there, `checkpoint.load` explains
        raise CharlmError(f"--resume: no checkpoint {ckpt_path}; start the run without --resume")
    try:
        saved = checkpoint.check_config(checkpoint.load(ckpt_path))
    except ValueError as e:
        raise checkpoint.damaged(ckpt_path, e) from None
    if config_path is not None:
        cfg = load_config(config_path, overrides)
    else:
        raw = apply_overrides(copy.deepcopy(saved), overrides)
        cfg = RunConfig.from_dict(raw, f"{ckpt_path} config")
    # Resolved, so a key missing from an older checkpoint's config counts as its default.
    saved_model = RunConfig.from_dict({"model": saved["model"]}, f"{ckpt_path} config").model
    for key, value in dataclasses.asdict(saved_model).items():
        new = getattr(cfg.model, key)
        if new != value:
            raise CharlmError(
                f"--resume: model.{key}={new!r} conflicts with the checkpoint's {value!r} in "
                f"{ckpt_path}; the architecture of a run cannot change (drop the override, or "
                "start a new run with another --out)"
            )
    return cfg


def _check_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to start a fresh run over an existing one unless told to; make sure the run dir
    is writable. Removes nothing (see `_clear_run`)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise CharlmError(f"train.out_dir {run_dir} is a file; choose a directory")
    existing = [n for n in RUN_FILES if (run_dir / n).exists()]
    if existing and not resume and not overwrite:
        # A run stopped before its first checkpoint has files but nothing to resume from.
        how = "continue it with --resume, " if "last.pt" in existing else ""
        raise CharlmError(
            f"{run_dir} already holds a run ({', '.join(existing)}); {how}start over with "
            "--overwrite, or choose another --out"
        )
    make_writable_dir(run_dir, f"run dir {run_dir}")


def _clear_run(run_dir: Path) -> None:
    """--overwrite: remove the previous run's files (the prepared dataset cache stays)."""
    for name in RUN_FILES:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def train(cfg: RunConfig, resume: bool = False, overwrite: bool = False,
          progress: bool | None = None) -> TrainState:
    """Train (or resume) the run described by `cfg` in `cfg.train.out_dir`; under torchrun,
    this rank's part of a DDP run."""
    with (distributed(resolve_device(cfg.train.device)) as (dist, device),
          run_lock(Path(cfg.train.out_dir), dist.is_main)):
        return _train(cfg, dist, device, resume, overwrite, progress)


@contextlib.contextmanager
def run_lock(run_dir: Path, enabled: bool = True) -> Iterator[None]:
    """Hold an exclusive lock (flock) on the run dir itself for the whole run, so a second
    `charlm train` into it (a fresh start or a --resume) is refused instead of interleaving its
    logs and checkpoints with this one's. No lock file: the lock goes with the process, even on
    SIGKILL. A run dir that cannot be made is left to `_check_run_dir` to report. Directories
    made here that are still empty at the end (a run that failed before writing anything, such
    as `charlm train` on a mistyped file name) are removed again."""
    if not enabled:
        yield
        return
    for _ in range(10):
        made = [d for d in (run_dir, *run_dir.parents) if not d.exists()]  # deepest first
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(run_dir, os.O_RDONLY)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CharlmError(
                f"{run_dir} is in use by another `charlm train`; wait for it to end, or choose "
                "another --out"
            ) from None
        except OSError:  # a filesystem without locks (some network mounts): run unlocked
            break
        try:  # locked: is it still the directory at run_dir? (a failed run removes its own)
            now, held = os.stat(run_dir), os.fstat(fd)
            if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                break
        except OSError:
            pass
        os.close(fd)
    else:
        raise CharlmError(f"{run_dir} keeps being removed by another process; choose another --out")
    try:
        yield
    finally:
        for d in made:  # removed while the lock is held, so no other run can have taken it
            try:
                d.rmdir()  # only an empty directory
            except OSError:
                break
        os.close(fd)


def _train(cfg: RunConfig, dist: Dist, device: torch.device, resume: bool, overwrite: bool,
           progress: bool | None) -> TrainState:
    t_start = time.perf_counter()
    tc = cfg.train
    run_dir = Path(tc.out_dir)
    dtype = resolve_dtype(tc.dtype, device)
    if tc.batch_size % dist.world_size:
        raise CharlmError(
            f"train.batch_size {tc.batch_size} does not split over {dist.world_size} processes; "
            "make it a multiple of the number of processes (nproc_per_node x nnodes)"
        )
    _check_run_dir(run_dir, resume, overwrite)
    seed_everything(tc.seed)

    # Every rank loads the same last.pt, onto the CPU: torch sets RNG states only from CPU
    # tensors (a CUDA one is "RNG state must be a torch.ByteTensor"), and the model's and the
    # optimizer's load_state_dict copy their tensors to the device themselves.
    ckpt = checkpoint.load(run_dir / "last.pt") if resume else None

    def same_vocab(vocab: Vocab) -> None:
        if ckpt is not None and ckpt.get("vocab") != vocab.chars:
            raise CharlmError(
                f"--resume: the vocabulary of {cfg.data.path} differs from the run's checkpoint; "
                "resume with the data the run was started on"
            )

    with dist.main_first():  # rank 0 prepares the dataset cache; the others then reuse it
        data = dataset_for(cfg.data.path, cfg.data.val_fraction, run_dir / "dataset",
                           same_vocab)
    same_vocab(data.vocab)  # also for a prepared dataset dir, or a reused cache
    prepared_with = data.meta.get("val_fraction")
    set_by_user = cfg.data.val_fraction != DataConfig.val_fraction  # the default says nothing
    if (Path(cfg.data.path).is_dir() and set_by_user and prepared_with != cfg.data.val_fraction
            and dist.is_main):
        print(f"warning: data.val_fraction={cfg.data.val_fraction} does not apply to the "
              f"prepared dataset {cfg.data.path}, whose split was made with --val-fraction "
              f"{prepared_with}; run `charlm prepare` again to change it", file=sys.stderr)
    if cfg.optim.warmup_iters >= tc.max_iters and dist.is_main:  # a short trial run, often
        print(f"warning: optim.warmup_iters={cfg.optim.warmup_iters} is not below "
              f"train.max_iters={tc.max_iters}: the learning rate never reaches optim.lr="
              f"{cfg.optim.lr:g}; lower optim.warmup_iters to train at full rate", file=sys.stderr)
    for split in ("train", "val"):
        require_window(data.split(split), cfg.model.block_size, split, cfg.data.path)
    sampler = BatchSampler(data.train, cfg.model.block_size, tc.batch_size, device, tc.seed,
                           name="train", rows=dist.rows(tc.batch_size))
    require_model_memory(cfg.model, len(data.vocab), device)
    model = GPT(cfg.model, len(data.vocab)).to(device)
    optimizer = make_optimizer(model, cfg.optim)
    scaler = grad_scaler(device, dtype)
    state = TrainState()

    if ckpt is not None:
        try:
            checkpoint.check_train_state(ckpt)
            model.load_state_dict(ckpt["model"])
            load_state(optimizer, ckpt["optimizer"])
            # {}: saved without loss scaling (float32, bf16), which a float16 resume (another
            # GPU, or --set train.dtype=float16) starts afresh; torch refuses to load it.
            if ckpt["scaler"] != {}:
                scaler.load_state_dict(ckpt["scaler"])
            state.load_state_dict(ckpt["train_state"])
            sampler.load_state_dict(ckpt["sampler"])
            torch.set_rng_state(ckpt["rng"]["torch"])
            if device.type == "cuda" and "cuda" in ckpt["rng"]:  # the GPUs of both machines
                for index, rng in enumerate(ckpt["rng"]["cuda"][:torch.cuda.device_count()]):
                    torch.cuda.set_rng_state(rng, index)
        except (KeyError, RuntimeError, ValueError, TypeError, AttributeError) as e:
            raise checkpoint.damaged(run_dir / "last.pt", e) from None
        if state.step > tc.max_iters:  # it would stop at once, with a config that is not the run's
            raise CharlmError(
                f"--resume: train.max_iters={tc.max_iters} is below the step the run has "
                f"reached ({state.step}, {run_dir / 'last.pt'}); give at least {state.step}"
            )
    elif overwrite and dist.is_main:  # only now that data, model and config are known to be good
        _clear_run(run_dir)
    with dist.main_first():  # rank 0 writes (here and below); the others hear if it failed
        if dist.is_main:
            for name in RUN_FILES:  # the run lock is ours: what a killed run left half-saved goes
                remove_temps(run_dir / name)
            save_config(cfg, run_dir / "config.yaml")

    step_model = model
    if tc.compile:
        rows = tc.batch_size // dist.world_size  # this rank's micro-batch
        step_model, failure = compile_model(model, (rows, cfg.model.block_size), device, dtype)
        if failure and dist.is_main:
            print(f"warning: torch.compile failed ({failure}); training without compile",
                  file=sys.stderr)
    ddp_model = dist.wrap(step_model, device)  # step_model itself when not distributed
    eval_group = eval_batches_per_forward(cfg, device, len(data.vocab),
                                          tc.batch_size // dist.world_size)
    # Stacked eval batches have a shape the compiled graph was not built for: those run eagerly.
    eval_model = step_model if eval_group == 1 else model

    def snapshot() -> dict[str, Any]:
        rng = {"torch": torch.get_rng_state()}
        if device.type == "cuda":
            rng["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
        return {
            "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(), "train_state": state.state_dict(),
            "sampler": sampler.state_dict(), "rng": rng, "config": cfg.to_dict(),
            "vocab": data.vocab.chars,
        }

    def write(train_event: dict[str, Any] | None, losses: dict[str, float] | None,
              improved: bool, write_last: bool) -> None:
        """Rank 0's part of a log, eval or checkpoint step: the log events, the eval's line
        and sample, then best.pt and last.pt."""
        if train_event is not None:
            log.log("train", **train_event)
        if losses is not None:
            log.log("eval", step=state.step, elapsed_s=round(state.elapsed_s, 3),
                    tokens=state.tokens, lr=lr, train_loss=losses["train"],
                    val_loss=losses["val"], val_bpc=losses["val"] / LN2,
                    best_val_loss=state.best_val)
            log.message(f"step {state.step}: train {losses['train']:.4f}, val "
                        f"{losses['val']:.4f} ({losses['val'] / LN2:.3f} bpc), "
                        f"{state.elapsed_s:.1f}s" + (" *best" if improved else ""))
            if tc.sample_chars:
                try:
                    log.sample(preview(model, data.vocab, tc.sample_chars, tc.seed), state.step)
                except NonFiniteOutput:  # max_bad_steps decides whether the run stops
                    log.message(f"step {state.step}: no sample, the model's outputs are not "
                                "finite")
        if write_last or improved:
            state.elapsed_s = elapsed_before + time.perf_counter() - t_start
            ckpt = snapshot()
            # best.pt first: a last.pt on disk never counts a best val whose best.pt a crash
            # kept from being written (a resume from the older last.pt evaluates that step
            # again and writes best.pt then).
            if improved:
                checkpoint.save(ckpt, run_dir / "best.pt")
            if write_last:
                checkpoint.save(ckpt, run_dir / "last.pt")

    tokens_per_step = tc.batch_size * tc.grad_accum * cfg.model.block_size
    last_interval = tc.checkpoint_interval or tc.eval_interval  # null: last.pt at every eval
    elapsed_before = state.elapsed_s
    with dist.main_first():
        log = MetricsLogger(run_dir, tc.max_iters, state.step, progress, enabled=dist.is_main)
    bad = BadSteps(tc.max_bad_steps, state.skipped_steps, state.bad_streak, device)
    saved_step = state.step if resume else None  # the step of the last.pt on disk
    final: dict[str, float] | None = None  # the losses of the latest eval
    stop = StopSignals(announce=dist.is_main)
    try:
        with stop:
            model.train()
            t_log, steps_since_log = time.perf_counter(), 0
            while state.step < tc.max_iters:
                lr = lr_at(state.step, cfg.optim, tc.max_iters)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                loss, norm, ok = train_step(ddp_model, optimizer, scaler, sampler, cfg, device,
                                            dtype, dist)
                state.step += 1
                state.tokens += tokens_per_step
                bad.record(ok, state.step)
                steps_since_log += 1
                log.advance()
                last = state.step == tc.max_iters
                log_now = state.step % tc.log_interval == 0 or last
                eval_now = state.step % tc.eval_interval == 0 or last
                signum = dist.agree_signal(stop.signum)
                stopping = signum is not None and not last
                write_last = state.step % last_interval == 0 or last or stopping
                if log_now or eval_now or write_last:  # the only steps that wait for the device
                    skipped_before = state.skipped_steps
                    state.skipped_steps, state.bad_streak = bad.check(run_dir / "last.pt",
                                                                      saved_step)
                    if state.skipped_steps > skipped_before:
                        log.message(f"step {state.step}: skipped "
                                    f"{state.skipped_steps - skipped_before} update(s) with a "
                                    f"non-finite loss or gradient norm "
                                    f"({state.skipped_steps} so far)")
                train_event: dict[str, Any] | None = None
                if log_now:
                    now = time.perf_counter()
                    state.elapsed_s = elapsed_before + now - t_start
                    train_event = dict(
                        step=state.step, elapsed_s=round(state.elapsed_s, 3),
                        tokens=state.tokens, lr=lr, train_loss=loss.item(),
                        grad_norm=norm.item(), skipped_steps=state.skipped_steps,
                        tokens_per_s=steps_since_log * tokens_per_step / (now - t_log))
                    t_log, steps_since_log = now, 0
                t_pause = time.perf_counter()  # evals, samples and saves are not training time
                improved = False
                if eval_now:
                    final = evaluate(eval_model, data, cfg, device, dtype, dist, eval_group)
                    state.elapsed_s = elapsed_before + time.perf_counter() - t_start
                    improved = final["val"] < state.best_val
                    state.best_val = min(state.best_val, final["val"])
                if log_now or eval_now or write_last:
                    # Rank 0 alone writes: should that fail (a full disk), the others hear it
                    # and end quietly, instead of in their next collective with a traceback.
                    with dist.main_first():
                        if dist.is_main:
                            write(train_event, final if eval_now else None, improved,
                                  write_last)
                    if write_last:
                        saved_step = state.step
                t_log += time.perf_counter() - t_pause  # tokens/s counts training time only
                if stopping:  # last.pt is saved (under torchrun, main_first waited for it)
                    raise Interrupted(
                        f"interrupted by {signal.Signals(signum).name} at step "
                        f"{state.step}: saved {run_dir / 'last.pt'}; continue with "
                        f"`charlm train --out {shlex.quote(str(run_dir))} --resume`",
                        signum,
                    )
        if final is not None:
            with dist.main_first():
                log.hparams(cfg.to_dict(), {
                    "hparams/best_val_loss": state.best_val,
                    "hparams/final_val_loss": final["val"],
                    "hparams/final_val_bpc": final["val"] / LN2,
                    "hparams/final_train_loss": final["train"],
                }, state.step)
    finally:
        log.close()
    return state
