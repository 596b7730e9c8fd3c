"""Devices and numerics: resolve `auto`, pick the AMP dtype, build the autocast context and the
GradScaler (fp16 only), seed every RNG, and set up DistributedDataParallel under torchrun.

Under torchrun (`WORLD_SIZE`, `RANK`, `LOCAL_RANK` in the environment) `distributed` joins the
process group (NCCL on CUDA, gloo on the CPU) and hands out a `Dist`: the rank's place in the
world and the few collectives the training loop needs. Without torchrun it hands out the
single-process `Dist`, whose collectives do nothing, so one loop serves both.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist
from torch.nn.parallel import DistributedDataParallel

from charlm.config import device_error
from charlm.errors import CharlmError, first_line


def resolve_device(name: str, option: str = "train.device") -> torch.device:
    """`auto` picks cuda > mps > cpu; an explicit device that is missing is an error, which
    names `option` (the config key, or `--device` for sample and eval) and how to change it."""
    unknown = device_error(name)
    if unknown:
        raise CharlmError(unknown)
    has_mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if has_mps else "cpu")
    fix = "--set train.device=cpu" if option == "train.device" else f"{option} cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise CharlmError(
            f"{option} is {name!r} but no CUDA GPU is available to this torch build; "
            f"use {fix} (or auto), or install a CUDA build of torch"
        )
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise CharlmError(f"{option} is {name!r} but this machine has {n} CUDA "
                          f"GPU{'s' if n != 1 else ''} (cuda:0 to cuda:{n - 1}); use one of "
                          f"them, or cuda (the first)")
    if name == "mps" and not has_mps:
        raise CharlmError(f"{option} is 'mps' but MPS is not available; use {fix} (or auto)")
    return torch.device(name)


def memory_bytes(device: torch.device) -> int | None:
    """The device's total memory: the GPU's, or the machine's RAM for the CPU; None for MPS
    (it shares the machine's memory with everything else)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def require_memory(need: int, device: torch.device, needs: str, advice: str) -> None:
    """Refuse work whose `need` bytes alone exceed the device's memory, before it is allocated:
    a mistyped size could take the machine down first. The error reads `{needs}, more than the
    N GiB of {device}; {advice}`, with the need in GiB where `needs` says `{gib}`."""
    have = memory_bytes(device)
    if have is not None and need > have:
        needs = needs.replace("{gib}", f"{need / 2**30:,.1f} GiB")
        raise CharlmError(f"{needs}, more than the {have / 2**30:,.1f} GiB of {device.type}; "
                          f"{advice}")


def cpu_bf16_unit() -> str | None:
    """What multiplies bf16 matrices in hardware on this CPU, or None where bf16 is emulated:
    "AMX" (tiles; Intel Sapphire Rapids and later) or "AVX512_BF16" (bf16 dot products; AMD
    Zen 4 and later, Intel Cooper Lake). On a 2-core Zen 5 EPYC, a 2048^3 bf16 matmul ran at
    4.1x the float32 one; on an AVX2-only EPYC, emulated bf16 ran at a twentieth of float32."""
    for unit, probe in (("AMX", "_is_amx_tile_supported"),
                        ("AVX512_BF16", "_is_avx512_bf16_supported")):
        supported = getattr(torch.cpu, probe, None)
        if supported and supported():
            return unit
    return None


def cuda_has_bf16(device: torch.device) -> bool:
    """Whether this GPU computes in bf16 natively: Ampere (compute capability 8) and later, or
    ROCm. (`torch.cuda.is_bf16_supported()` also says yes on a V100 or T4, which only emulate
    it, slowly, and it asks about the current GPU rather than `device`.)"""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype for autocast. `auto`: bf16 on a GPU that has it natively, else fp16 with
    a GradScaler; on a CPU that multiplies bf16 in hardware (`cpu_bf16_unit`), bf16 (faster
    per step there, with the same loss curve); float32 on other CPUs (bf16 is emulated there,
    and slower) and on MPS."""
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if cuda_has_bf16(device) else torch.float16
        if device.type == "cpu" and cpu_bf16_unit():
            return torch.bfloat16
        return torch.float32
    dtype = DTYPES[name]
    if dtype == torch.float16 and device.type == "cpu":
        raise CharlmError(
            "train.dtype float16 is not supported on the CPU; use bfloat16 or float32"
        )
    return dtype


def weights_dtype(name: str, option: str = "dtype") -> torch.dtype:
    """The dtype a loaded model's weights are cast to for sampling and scoring (`--dtype`).

    float32 is the model as trained. bfloat16 and float16 halve the bytes a decode step streams
    from memory, which bounds batch-1 decoding: faster on any CPU or GPU, at the cost of
    rounding the weights and activations (float16 keeps 3 more mantissa bits than bfloat16).
    Logits are sampled in float32 either way."""
    if name not in DTYPES:
        raise CharlmError(f"{option} must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Mixed precision for the forward pass; weights stay fp32 (the master copy)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def compile_model(model: torch.nn.Module, example: tuple[torch.Tensor, ...],
                  device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, str | None]:
    """`torch.compile(model)`, tried out at once: one forward and backward of `example` (a
    training batch's shapes, in zeros) under the training autocast, so a backend that cannot
    build here (no C++ compiler, an unsupported device or op) fails now rather than mid-run.
    Returns (compiled model, None), or (model, a one-line reason) to train without compile. The
    probe leaves no gradients and draws no random numbers; its graph is the one training then
    reuses."""
    try:
        compiled = torch.compile(model)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            # separate contiguous tensors, as the samplers return: dynamo guards on that
            with autocast(device, dtype):
                _, loss = compiled(*example)
            loss.backward()
        return compiled, None
    except Exception as e:  # any failure: compile is an optimisation, never a requirement
        return model, first_line(e)
    finally:
        model.zero_grad(set_to_none=True)


def grad_scaler(device: torch.device, dtype: torch.dtype) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (bf16 and fp32 need no loss scaling)."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


@dataclass(frozen=True)
class Dist:
    """This process's place in a torchrun world; `Dist()` is a plain single-process run.

    `flags` is a gloo group for host-side values (the stop flag): with NCCL a CPU tensor cannot
    go through the default group, and a CUDA one would make the host wait for the device."""

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
        """This rank's rows of a global batch of `batch_size` rows."""
        per_rank = batch_size // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def mean_(self, value: torch.Tensor) -> torch.Tensor:
        """Average a tensor over ranks, in place (gloo has no AVG, hence SUM then divide).
        Enqueued on the device stream under NCCL: the host does not wait."""
        if self.active:
            torch_dist.all_reduce(value, op=torch_dist.ReduceOp.SUM)
            value /= self.world_size
        return value

    def agree_signal(self, signum: int | None) -> int | None:
        """The stop signal any rank has received (the largest number if several), so all ranks
        stop at the same step. One host-side all-reduce of one integer."""
        if not self.active:
            return signum
        flag = torch.tensor(signum or 0)
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MAX, group=self.flags)
        return int(flag) or None

    def barrier(self) -> None:
        if self.active:
            torch_dist.barrier()

    def all_ok(self, ok: bool) -> bool:
        """Whether every rank says `ok`."""
        return bool(self.least(int(ok)))

    def least(self, value: int) -> int:
        """The smallest of the ranks' `value`: one host-side all-reduce of one integer."""
        if not self.active:
            return value
        flag = torch.tensor(value)
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN, group=self.flags)
        return int(flag)

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Rank 0 runs the block (say, writing a cache) before the other ranks do. Should rank 0
        fail in it, it tells the others, which then raise a CharlmError without running the
        block (rank 0 reports the cause) instead of failing in a collective with a traceback."""
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
        """The module that training steps call: DDP around `model` when distributed."""
        if not self.active:
            return model
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)


def sync_grads(model: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Around the forward and backward of a micro-step: DDP all-reduces the gradients only when
    `sync` (the last micro-step of an accumulation); the others accumulate locally."""
    if sync or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def _torchrun_env() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) when launched by torchrun, else None."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    env = os.environ
    return int(env["RANK"]), int(env.get("LOCAL_RANK", env["RANK"])), int(env["WORLD_SIZE"])


def is_main_process() -> bool:
    """False on the ranks of a torchrun world other than 0 (they stay quiet)."""
    place = _torchrun_env()
    return place is None or place[0] == 0


def reports_errors() -> bool:
    """Whether this process prints the `error:` line of bad input: outside torchrun, yes; under
    it, local rank 0 alone, as the ranks fail alike (the same arguments and files), so each
    machine's torchrun shows the error once."""
    place = _torchrun_env()
    return place is None or place[1] == 0


@contextlib.contextmanager
def distributed(device: torch.device) -> Iterator[tuple[Dist, torch.device]]:
    """Join the torchrun process group for the duration of a run; yields (Dist, device), the
    device being `cuda:LOCAL_RANK` on CUDA. A group the caller set up is used and left up."""
    place = _torchrun_env()
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
