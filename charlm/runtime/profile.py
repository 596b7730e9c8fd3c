"""The run's profile: every choice that depends on the machine, made once before a run's
objects are built and written into config.yaml, so `--resume` and a copied run dir compute as
the first run did. A decoding model's `DecodeLayout` is timed once by its owner, before decoding.

Threads: torch's CPU threads wait for each other after every kernel, so beside busy processes
each kernel waits for the scheduler (docs/benchmarks-log.md, "Threads on a busy CPU"); `auto`
takes the cores the others leave free at the start, and never changes mid-run: results depend
on it in the last bits.

Dtype: bf16 on a GPU that has it natively (else float16 with a GradScaler); on a CPU, bf16
where hardware multiplies it and a product measures at least BF16_GAIN times float32's speed."""

from __future__ import annotations

import math
import os
import statistics
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.model.layers import decoding_linears, product, split_product
from charlm.runtime.precision import cuda_has_bf16, resolve_dtype

BF16_GAIN = 1.5  # bf16 products must run this many times float32's speed for autocast to pay
PROBE_N, PROBE_REPEATS = 768, 3
PROBE_COUNT, PROBE_SIDE = 12, 1024  # `probe_weights`: 48 MiB of float32
LOAD_S = 0.2  # the window over which the other processes' load is read
RATE_S = 0.2  # a model's training rate is timed over at least this long, after one step


@dataclass(frozen=True)
class Profile:
    """What a run computes with, and why, for its one line."""

    threads: int
    dtype: str  # a train.dtype value: float32, bfloat16 or float16
    why_threads: str
    why_dtype: str

    def line(self, device: torch.device) -> str:
        return (f"profile: {device}, {self.threads} thread{'s' if self.threads > 1 else ''} "
                f"({self.why_threads}), {self.dtype} ({self.why_dtype}); recorded in "
                "config.yaml (train.threads, train.dtype pin them)")


class Machine:
    """What the profile asks of the machine; a test's subclass answers instead."""

    def cores(self) -> int:
        """The cores this process may run on (its affinity where the OS has one)."""
        try:
            return len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # macOS, Windows
            return os.cpu_count() or 1

    def busy_elsewhere(self) -> float | None:
        """Cores other processes keep busy over LOAD_S; None without /proc/stat."""
        first = cpu_times()
        time.sleep(LOAD_S)
        last = cpu_times()
        if first is None or last is None or last[1] <= first[1]:
            return None
        cpus = os.cpu_count() or 1
        busy = (last[0] - first[0]) / (last[1] - first[1]) * cpus  # this process's included
        wall = (last[1] - first[1]) / cpus
        return max(busy - (last[2] - first[2]) / wall, 0.0)

    def bf16_unit(self) -> str | None:
        """What multiplies bf16 matrices in hardware here: "AMX" (Intel Sapphire Rapids on),
        "AVX512_BF16" (AMD Zen 4 on, Intel Cooper Lake), or None (emulated)."""
        for unit, probe in (("AMX", "_is_amx_tile_supported"),
                            ("AVX512_BF16", "_is_avx512_bf16_supported")):
            supported = getattr(torch.cpu, probe, None)
            if supported and supported():
                return unit
        return None

    def bf16_speedup(self) -> float:
        """bf16's speed over float32's in a square product, drawing no random numbers."""
        with torch.random.fork_rng(devices=[]):
            a = torch.randn(PROBE_N, PROBE_N)
        return best_time(lambda: torch.mm(a, a)) / best_time(
            lambda x=a.bfloat16(): torch.mm(x, x))


def cpu_times() -> tuple[float, float, float] | None:
    """(machine busy, machine total, this process's) CPU seconds, or None without /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = sum(fields[:8]) / tick  # user nice system idle iowait irq softirq steal
    own = os.times()
    return total - (fields[3] + fields[4]) / tick, total, own.user + own.system


def best_time(f: Callable[[], object]) -> float:
    f()
    return min(timeit.repeat(f, number=1, repeat=PROBE_REPEATS))


def pick_threads(setting: int | str, device: torch.device, machine: Machine) -> tuple[int, str]:
    """`train.threads`: a number, else OMP_NUM_THREADS, else on the CPU the cores left free."""
    if isinstance(setting, int):
        return setting, "train.threads"
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp:
        return (int(omp) if omp.isdigit() and int(omp) >= 1 else torch.get_num_threads(),
                "OMP_NUM_THREADS")
    cores = machine.cores()
    if device.type != "cpu":
        return torch.get_num_threads(), f"torch's own, the device computes on {device.type}"
    others = machine.busy_elsewhere()
    if others is None:
        return cores, f"{cores} usable cores"
    free = max(1, min(cores, round(cores - others)))
    return free, f"of {cores} cores, other processes keep {others:.1f} busy"


def pick_dtype(setting: str, device: torch.device, machine: Machine) -> tuple[str, str]:
    """`train.dtype`: as given, or `auto` as the module's docstring says."""
    if setting != "auto":
        resolve_dtype(setting, device)  # float16 on a CPU is an error
        return setting, "train.dtype"
    if device.type == "cuda":
        native = cuda_has_bf16(device)
        return ("bfloat16", "native on this GPU") if native else (
            "float16", "this GPU has no native bf16")
    if device.type != "cpu":
        return "float32", f"on {device.type}"
    unit = machine.bf16_unit()
    if unit is None:
        return "float32", "this CPU emulates bf16"
    speedup = machine.bf16_speedup()
    dtype = "bfloat16" if speedup >= BF16_GAIN else "float32"
    return dtype, f"{unit} multiplies bf16 at {speedup:.2f}x float32's speed here"


def decide(threads: int | str, dtype: str, device: torch.device,
           machine: Machine | None = None) -> Profile:
    """The profile of these settings on `device`; sets torch's thread count (the one place)."""
    machine = machine or Machine()
    count, why_threads = pick_threads(threads, device, machine)
    name, why_dtype = pick_dtype(dtype, device, machine)
    torch.set_num_threads(count)
    return Profile(count, name, why_threads, why_dtype)


def train_rate(step: Callable[[], None], tokens: int, device: torch.device) -> float:
    """Training tokens a second of `step` (`tokens` a step), over at least RATE_S."""
    def synced() -> None:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    synced()
    steps, start = 0, time.perf_counter()
    while steps < 2 or time.perf_counter() - start < RATE_S:
        synced()
        steps += 1
    return steps * tokens / (time.perf_counter() - start)


@dataclass(frozen=True)
class DecodeLayout:
    """How decode steps multiply large float32 CPU weights (`lay_out_for_decoding`)."""

    split_parts: int = 1
    column_major: bool = False

    def describe(self) -> str:
        if self.column_major:
            return "decode weights column-major"
        if self.split_parts > 1:
            return f"decode products split over {self.split_parts} threads"
        return "decode products unsplit"


def probe_weights() -> torch.Tensor:
    """Square float32 weights, more than most last-level caches hold, so products by them
    stream from memory as a decode step does (on a cached one, answers flipped run to run)."""
    return torch.full((PROBE_COUNT, PROBE_SIDE, PROBE_SIDE), 0.01)


def faster(a: Callable, b: Callable, rounds: int = 7) -> bool:
    """Whether a's median time over `rounds` calls beats b's, called in turn after one untimed
    call each, so a drifting machine slows both alike."""
    a(), b()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for f, ts in zip((a, b), times, strict=True):
            ts.append(timeit.timeit(f, number=1))
    return statistics.median(times[0]) < statistics.median(times[1])


def decode_layout(threads: int, *, column_major: bool = True,
                  faster: Callable[[Callable, Callable], bool] = faster) -> DecodeLayout:
    """The layout that multiplies 1 and 16 rows by `probe_weights` fastest here: split where
    one-row products run faster so (some BLAS, MKL on AMD EPYCs, compute one row on one core),
    column-major (if allowed) where that beats the row-major products."""
    with torch.inference_mode():
        rows, x = probe_weights(), torch.randn(1, PROBE_SIDE)
        parts = math.gcd(PROBE_SIDE, threads)
        if parts > 1 and not faster(lambda: [split_product(x, w, None, parts) for w in rows],
                                    lambda: [F.linear(x, w) for w in rows]):
            parts = 1
        if not column_major:
            return DecodeLayout(parts)
        columns = rows.transpose(1, 2).contiguous().transpose(1, 2)  # the same values
        xs = [x, torch.randn(16, PROBE_SIDE)]
        return DecodeLayout(parts, faster(
            lambda: [F.linear(x, w) for x in xs for w in columns],
            lambda: [product(x, w, None, parts) for x in xs for w in rows]))


def layout_for(model: nn.Module, *, column_major: bool = True) -> DecodeLayout:
    """`decode_layout` over torch's threads where `model` has `decoding_linears`, else
    DecodeLayout() untimed; column_major=False for a model whose weights must stay row-major."""
    if not decoding_linears(model):
        return DecodeLayout()
    return decode_layout(torch.get_num_threads(), column_major=column_major)
