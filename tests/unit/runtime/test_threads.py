"""charlm.runtime.threads: the compute threads that follow the load (`train.threads: auto`),
with the load and the thread setter injected."""

import time

import pytest
import torch

from charlm.runtime import threads as threads_module
from charlm.runtime.threads import CHECK_S, CpuUse, Threads, wanted

CPU = torch.device("cpu")


class Load:
    """A CpuUse whose looks see `others` cores kept busy by other processes, in turn."""

    def __init__(self, *others):
        self.seen = list(others)

    def others(self):
        return self.seen.pop(0)


@pytest.mark.parametrize("cores, others, count", [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.9, 1), (2, 5.0, 1), (8, 2.2, 6), (1, 0.0, 1)])
def test_the_count_is_the_cores_the_others_leave_free_at_least_one(cores, others, count):
    assert wanted(cores, others) == count


def auto(monkeypatch, *others, cores=2, count=2) -> tuple[Threads, list]:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads_module, "usable_cores", lambda: cores)
    monkeypatch.setattr(torch, "get_num_threads", lambda: count)
    calls = []
    return Threads.start("auto", CPU, 0.0, Load(*others), calls.append), calls


def test_a_busy_cpu_at_start_is_one_warning_and_fewer_threads(monkeypatch):
    threads, calls = auto(monkeypatch, 1.9)
    assert threads.check(0.5) == (
        "warning: the CPU is busy: other processes keep 1.9 of 2 cores busy; training on 1 "
        f"thread of 2, as many as they leave free, checked every {CHECK_S:.0f} s "
        "(train.threads pins the count)")
    assert calls == [1] and threads.count == 1


def test_later_changes_need_two_looks_in_a_row_spaced_by_the_check_interval(monkeypatch):
    threads, calls = auto(monkeypatch, 0.1, 1.2, 0.1, 1.1, 1.3, 0.2, 0.0)
    assert threads.check(0.5) is None and calls == []  # idle: all cores
    assert threads.check(1.0) is None  # too soon: no look
    assert threads.check(0.5 + CHECK_S) is None  # busy once
    assert threads.check(0.5 + 2 * CHECK_S) is None  # idle again: nothing changes
    assert threads.check(0.5 + 3 * CHECK_S) is None and calls == []
    assert threads.check(0.5 + 4 * CHECK_S) == (
        "threads 2 -> 1: other processes keep 1.3 of 2 cores busy")
    assert calls == [1]
    assert threads.check(0.5 + 5 * CHECK_S) is None
    assert threads.check(0.5 + 6 * CHECK_S) == (
        "threads 1 -> 2: other processes keep 0.0 of 2 cores busy")
    assert calls == [1, 2]


def test_a_pinned_count_omp_num_threads_or_a_gpu_never_follow_the_load(monkeypatch):
    calls = []
    pinned = Threads.start(3, CPU, 0.0, Load(1.9), calls.append)
    assert calls == [3] and pinned.check(1.0) is None and calls == [3]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert Threads.start("auto", CPU, 0.0, Load(1.9), calls.append).check(1.0) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    gpu = Threads.start("auto", torch.device("meta"), 0.0, Load(1.9), calls.append)
    assert gpu.check(1.0) is None and calls == [3]


def test_no_load_to_read_changes_nothing(monkeypatch):
    threads, calls = auto(monkeypatch, None, None)
    assert threads.check(0.5) is None and threads.check(0.5 + CHECK_S) is None and calls == []


def test_cpu_use_reads_proc_stat_or_says_it_cannot(monkeypatch):
    use = CpuUse()
    if use.last is not None:  # Linux: the cores others kept busy over a moment, >= 0
        end = time.perf_counter() + 0.1
        while time.perf_counter() < end:  # this process's own work is not counted as theirs
            pass
        others = use.others()
        assert others is not None and 0.0 <= others <= (threads_module.os.cpu_count() or 1)
    monkeypatch.setattr(CpuUse, "sample", staticmethod(lambda: None))
    assert CpuUse().others() is None
