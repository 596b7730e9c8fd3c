"""How many threads torch computes with on the CPU while training (`train.threads`).

torch runs its CPU kernels on one thread per core, and the threads wait for each other at the
end of every kernel. When other processes keep cores busy, one of the threads is often not
running and every kernel waits for the scheduler: beside two busy loops on a 2-core CPU a step
took 100 times as long, an evaluation 20 s (docs/benchmarks.md, "Threads on a busy CPU"). So
`auto` computes on the cores the other processes leave free, at least one: the cores this
process may run on (its affinity) less the cores the others kept busy since the last look
(`CpuUse`: /proc/stat's busy time less this process's own). It looks again every CHECK_S
seconds and changes the count when two looks in a row agree on a new one. A number pins the
count; so does OMP_NUM_THREADS, which the user (or torchrun) set. Results depend on the count
in the last bits: a run that must repeat bitwise pins it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

CHECK_S = 5.0  # seconds between two looks at the load


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


class CpuUse:
    """The cores other processes kept busy between two `others` calls, from /proc/stat (Linux):
    the machine's busy time less this process's own CPU time. None where /proc/stat cannot be
    read, and for the first call (there is nothing to compare with yet)."""

    def __init__(self) -> None:
        self.last: tuple[float, float, float] | None = self.sample()

    @staticmethod
    def sample() -> tuple[float, float, float] | None:
        """(machine busy seconds, machine total seconds over all CPUs, this process's CPU
        seconds), or None without /proc/stat."""
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [float(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        if len(fields) < 5:
            return None
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        total = sum(fields[:8]) / tick  # user nice system idle iowait irq softirq steal
        idle = (fields[3] + fields[4]) / tick
        own = os.times()
        return total - idle, total, own.user + own.system

    def others(self) -> float | None:
        """Cores the other processes kept busy since the last call (the machine's CPU count
        times the busy share, less this process's own use)."""
        now = self.sample()
        last, self.last = self.last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        cpus = os.cpu_count() or 1
        busy = (now[0] - last[0]) / (now[1] - last[1]) * cpus  # cores busy, this one's included
        wall = (now[1] - last[1]) / cpus  # the seconds that passed
        return max(busy - (now[2] - last[2]) / wall, 0.0)


def wanted(cores: int, others: float) -> int:
    """The threads for `cores` usable cores of which `others` are kept busy elsewhere: the free
    ones, rounded, at least one."""
    return max(1, min(cores, round(cores - others)))


@dataclass
class Threads:
    """The compute threads of a training run; `check` after each step."""

    count: int
    auto: bool
    cores: int
    use: CpuUse | None
    set_threads: Callable[[int], None]
    next_check: float = 0.0
    looks: int = 0
    pending: int | None = None  # a new count one look has asked for

    @classmethod
    def start(cls, setting: int | str, device: torch.device, now: float,
              use: CpuUse | None = None,
              set_threads: Callable[[int], None] = torch.set_num_threads) -> Threads:
        """The threads of a run on `device`, with `train.threads` = `setting`; a pinned count
        is set here. Only `auto` on the CPU without OMP_NUM_THREADS follows the load, from the
        first `check` on (`use` began looking before the run was built)."""
        if isinstance(setting, int):
            set_threads(setting)
            return cls(setting, False, setting, None, set_threads)
        auto = device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS")
        return cls(torch.get_num_threads(), auto, usable_cores(), use if auto else None,
                   set_threads, now)

    def check(self, now: float) -> str | None:
        """Look at the load once CHECK_S have passed since the last look. The first look sets
        the count alone; later, two looks in a row must ask for the same new count. What
        changed, as a line for the log (a warning at the first look), else None."""
        if not self.auto or self.use is None or now < self.next_check:
            return None
        self.next_check = now + CHECK_S
        others = self.use.others()
        if others is None:
            return None
        self.looks += 1
        want = wanted(self.cores, others)
        if want == self.count:
            self.pending = None
            return None
        if self.looks > 1 and self.pending != want:
            self.pending = want
            return None
        before, self.count, self.pending = self.count, want, None
        self.set_threads(want)
        busy = f"other processes keep {others:.1f} of {self.cores} cores busy"
        if self.looks == 1:
            return (f"warning: the CPU is busy: {busy}; training on {want} thread"
                    f"{'s' if want > 1 else ''} of {before}, as many as they leave free, "
                    f"checked every {CHECK_S:.0f} s (train.threads pins the count)")
        return f"threads {before} -> {want}: {busy}"
