"""torchrun's process group for a run (`distributed`), what each rank knows of it (`Dist`), and
DDP's gradient sync skipped on the micro-steps of an accumulation."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel

from charlm.core.errors import CharlmError
from charlm.core.ranks import torchrun_place


@dataclass(frozen=True)
class Dist:
    """This process's place in a torchrun world; `Dist()` is a single-process run. `flags`: a
    gloo group for host-side values, which NCCL's default group cannot carry without a wait."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    active: bool = False  # a process group is up (launched by torchrun)
    flags: Any = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs, prints, samples and writes files."""
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        per_rank = batch_size // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def mean_(self, value: torch.Tensor) -> torch.Tensor:
        """Average a tensor over ranks in place (gloo has no AVG); the host does not wait."""
        if self.active:
            torch_dist.all_reduce(value, op=torch_dist.ReduceOp.SUM)
            value /= self.world_size
        return value

    def agree(self, signum: int | None, *values: float) -> tuple[Any, ...]:
        """The largest stop signal any rank has received and the largest of each of `values`,
        so all ranks set the same learning rate and stop at the same step."""
        if not self.active:
            return (signum, *values)
        flags = torch.tensor([float(signum or 0), *values], dtype=torch.float64)
        torch_dist.all_reduce(flags, op=torch_dist.ReduceOp.MAX, group=self.flags)
        return (int(flags[0]) or None, *flags[1:].tolist())

    def all_ok(self, ok: bool) -> bool:
        return bool(self.least(int(ok)))

    def least(self, value: int) -> int:
        if not self.active:
            return value
        flag = torch.tensor(value)
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN, group=self.flags)
        return int(flag)

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block first; should it fail, the others raise a CharlmError."""
        if not self.is_main:
            if not self.all_ok(True):
                raise CharlmError("process 0 of the torchrun world failed (its error is on "
                                  "its machine's stderr)")
            yield
            return
        try:
            yield
        except BaseException:
            self.all_ok(False)
            raise
        self.all_ok(True)

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        if not self.active:
            return model
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)


def sync_grads(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Around a micro-step: DDP all-reduces the gradients only when `sync` (the last)."""
    if sync or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


@contextlib.contextmanager
def distributed(device: torch.device) -> Iterator[tuple[Dist, torch.device]]:
    """Join torchrun's process group for a run, yielding (Dist, device: `cuda:LOCAL_RANK` on
    CUDA); a group the caller set up is used and left up."""
    place = torchrun_place()
    if place is None:
        if device.type == "cuda" and device.index is not None:
            # cuda:N is the current GPU for the run: pinned memory and lazily created CUDA
            # state otherwise go to GPU 0, which may be someone else's
            torch.cuda.set_device(device)
        yield Dist(), device
        return
    rank, local_rank, world_size = place
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise CharlmError(
            f"torchrun: distributed training runs on cuda (NCCL) or cpu (gloo), not "
            f"{device.type}; use --set train.device=cuda or cpu, or run without torchrun"
        )
    owned = not torch_dist.is_initialized()
    if owned:
        torch_dist.init_process_group(
            backend, device_id=device if backend == "nccl" else None)
    try:
        flags = torch_dist.new_group(backend="gloo") if backend == "nccl" else None
        yield Dist(rank, local_rank, world_size, True, flags), device
        # Leave together: rank 0 still writes checkpoints and logs when the others are done, and
        # a rank that tears its connections down early can abort a peer (gloo: SIGABRT).
        torch_dist.barrier()
    finally:
        if owned:
            # The DDP wrapper sits in reference cycles (its hooks): collect it while the group
            # is alive, not at interpreter exit, where gloo threads holding it can abort.
            gc.collect()
            torch_dist.destroy_process_group()
