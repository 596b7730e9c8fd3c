"""Evaluation during training: the mean loss of each split over the same windows at every eval
(`evaluate`), in as few forwards as the device's memory allows."""

from __future__ import annotations

from collections.abc import Callable

import torch

from charlm.config.schema import RunConfig
from charlm.model.footprint import forward_bytes
from charlm.runtime.distributed import Dist
from charlm.runtime.precision import autocast
from charlm.training.tasks import Task, TextTask


def eval_batches_per_forward(cfg: RunConfig, task: Task, device: torch.device, rows: int) -> int:
    """Eval batches of `rows` stacked in a forward: on CUDA as many as fit in a quarter of the free
    memory (launch-bound forwards are slow); 1 on CPU and MPS (no faster) and for pairs (shapes)."""
    if device.type != "cuda" or not isinstance(task, TextTask):
        return 1
    free, _ = torch.cuda.mem_get_info(device)
    return batches_that_fit(free // 4, cfg, len(task.vocab), rows)


def batches_that_fit(budget: int, cfg: RunConfig, vocab_size: int, rows: int) -> int:
    """Batches of `rows` rows whose no-grad forward fits in `budget` bytes, 1 to `eval_iters`."""
    per_batch = forward_bytes(cfg.model, vocab_size, rows)
    return max(1, min(cfg.train.eval_iters, budget // per_batch))


class EvalStopped(Exception):
    """`evaluate` gave up between batches because `stop()` said so (a stop signal)."""


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: Task, device: torch.device, dtype: torch.dtype,
             dist: Dist = Dist(), batches_per_forward: int = 1,
             stop: Callable[[], bool] | None = None) -> dict[str, float]:
    """Mean loss (nats per character, or per target unit for pairs) over `eval_iters` batches
    of each split, `batches_per_forward` stacked in one forward, from a generator seeded afresh
    (the training RNG is left alone). Under DDP each rank scores its rows, the means averaged."""
    was_training = model.training
    model.eval()
    try:
        losses = {}
        tc = task.cfg.train
        for split in ("train", "val"):
            sampler = task.sampler(split, tc.seed + 1, device, rows=dist.rows(tc.batch_size))
            total = torch.zeros((), device=device)
            for first in range(0, tc.eval_iters, batches_per_forward):
                if stop is not None and stop():
                    raise EvalStopped
                n = min(batches_per_forward, tc.eval_iters - first)
                batches = zip(*(sampler.batch() for _ in range(n)), strict=True)
                with autocast(device, dtype):  # the mean of n equal batches
                    _, loss = model(*(torch.cat(parts) for parts in batches))
                total += loss * n
            losses[split] = dist.mean_(total / tc.eval_iters).item()
        return losses
    finally:
        model.train(was_training)
