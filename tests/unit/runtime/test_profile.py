"""charlm.runtime.profile: what `train.threads` and `train.dtype` resolve to from injected core
counts, loads and devices, that `decide` sets torch's threads to it, and the probes; the decode
layout each answer of the timing gives, with the timing injected (no clock read), the probes'
shape, and `faster`'s medians of calls in turn."""

import itertools
import time

import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.model import layers
from charlm.runtime import profile
from charlm.runtime.precision import resolve_dtype
from charlm.runtime.profile import (
    DecodeLayout,
    Machine,
    decide,
    decode_layout,
    layout_for,
    pick_dtype,
    pick_threads,
)

CPU = torch.device("cpu")


class Fake(Machine):
    """A machine of `cores` cores, `busy` of them kept busy by others (None: unknown), with a
    bf16 `unit` that multiplies at `speedup` times float32; it times nothing."""

    def __init__(self, cores=2, busy=0.0, unit=None, speedup=4.1):
        self.n, self.busy, self.unit, self.speedup = cores, busy, unit, speedup

    def cores(self):
        return self.n

    def busy_elsewhere(self):
        return self.busy

    def bf16_unit(self):
        return self.unit

    def bf16_speedup(self):
        return self.speedup


@pytest.fixture
def no_omp(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.parametrize("cores, busy, threads", [
    (2, 0.0, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 2.0, 1), (2, 5.0, 1), (8, 2.4, 6),
    (4, None, 4),  # no /proc/stat: every usable core
])
def test_auto_threads_are_the_cores_the_others_leave_free_at_the_start(no_omp, cores, busy,
                                                                       threads):
    assert pick_threads("auto", CPU, Fake(cores, busy))[0] == threads


def test_a_pinned_count_or_omp_num_threads_wins_and_a_gpu_keeps_torchs(no_omp, monkeypatch):
    assert pick_threads(3, CPU, Fake(2, 1.9)) == (3, "train.threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert pick_threads("auto", CPU, Fake(2, 0.0)) == (1, "OMP_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert pick_threads("auto", torch.device("meta"), Fake(2, 1.9))[0] == torch.get_num_threads()


@pytest.mark.parametrize("unit, speedup, dtype", [
    ("AMX", 4.1, "bfloat16"), ("AVX512_BF16", 1.5, "bfloat16"),
    ("AVX512_BF16", 1.4, "float32"), ("AVX512_BF16", 0.56, "float32"), (None, 4.1, "float32"),
])
def test_auto_dtype_on_a_cpu_is_bf16_only_where_a_unit_measures_faster(unit, speedup, dtype):
    """An Intel Xeon with AVX512_BF16 and no AMX multiplied bf16 at 0.56x float32's speed, and
    trained 1.32x faster in float32: a bf16 unit must also measure BF16_GAIN times faster."""
    assert pick_dtype("auto", CPU, Fake(unit=unit, speedup=speedup))[0] == dtype
    assert pick_dtype("bfloat16", CPU, Fake(unit=None)) == ("bfloat16", "train.dtype")


def test_auto_dtype_on_a_gpu_before_ampere_is_float16(monkeypatch):
    """torch.cuda.is_bf16_supported() says yes on a V100 or T4 (emulated bf16, without tensor
    cores): those train in float16 with loss scaling."""
    capability = {torch.device("cuda", 0): (8, 0), torch.device("cuda", 1): (7, 5)}
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: capability[d])
    assert pick_dtype("auto", torch.device("cuda", 0), Fake())[0] == "bfloat16"
    assert pick_dtype("auto", torch.device("cuda", 1), Fake())[0] == "float16"
    assert pick_dtype("bfloat16", torch.device("cuda", 1), Fake())[0] == "bfloat16"  # as asked


def test_float16_on_a_cpu_is_refused():
    with pytest.raises(CharlmError, match="^train.dtype float16 is not supported on the CPU"):
        pick_dtype("float16", CPU, Fake())
    assert resolve_dtype("bfloat16", CPU) == torch.bfloat16


def test_decide_sets_torchs_threads_once_and_says_why(no_omp):
    before = torch.get_num_threads()
    try:
        p = decide("auto", "auto", CPU, Fake(2, 1.0, "AVX512_BF16", 0.56))
        assert (p.threads, p.dtype, torch.get_num_threads()) == (1, "float32", 1)
        assert p.line(CPU) == (
            "profile: cpu, 1 thread (of 2 cores, other processes keep 1.0 busy), float32 "
            "(AVX512_BF16 multiplies bf16 at 0.56x float32's speed here); recorded in "
            "config.yaml (train.threads, train.dtype pin them)")
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("amx, avx512_bf16, unit", [
    (True, True, "AMX"), (True, False, "AMX"), (False, True, "AVX512_BF16"),
    (False, False, None),
])
def test_the_bf16_unit_is_read_from_torchs_cpu_probes(monkeypatch, amx, avx512_bf16, unit):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16,
                        raising=False)
    assert Machine().bf16_unit() == unit
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    assert Machine().bf16_unit() is None


def test_the_probes_time_the_machine_and_leave_the_random_streams_alone(monkeypatch):
    monkeypatch.setattr(profile, "LOAD_S", 0.05)
    monkeypatch.setattr(profile, "PROBE_N", 128)  # emulated bf16 products of 768 take seconds
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    assert Machine().bf16_speedup() > 0
    busy = Machine().busy_elsewhere()
    assert busy is None or 0.0 <= busy <= (Machine().cores() + 1)
    assert torch.equal(torch.rand(2), expected)


BOTH = [True, False]


def answering(*answers: bool) -> tuple[list, object]:
    """A `faster` that gives `answers` in turn without calling or timing what it compares; the
    list of the pairs it was asked about."""
    asked, left = [], list(answers)

    def faster(a, b) -> bool:
        asked.append((a, b))
        return left.pop(0)

    return asked, faster


@pytest.fixture
def no_clock(monkeypatch):
    def clock():
        raise AssertionError("the layout read the clock")
    monkeypatch.setattr(time, "perf_counter", clock)


@pytest.mark.parametrize(("split", "column_major"), list(itertools.product(BOTH, BOTH)))
def test_decode_layout_is_what_the_injected_timing_says(no_clock, split, column_major):
    asked, faster = answering(split, column_major)
    assert decode_layout(2, faster=faster) == DecodeLayout(2 if split else 1, column_major)
    assert len(asked) == 2


@pytest.mark.parametrize(("threads", "parts"), [(4, 4), (6, 2), (16, 16)])
def test_the_split_is_over_the_threads_that_divide_the_probes(no_clock, threads, parts):
    assert decode_layout(threads, faster=answering(True, False)[1]) == DecodeLayout(parts)


def test_one_thread_or_split_only_asks_one_question(no_clock):
    one_thread, faster = answering(True)
    assert decode_layout(1, faster=faster) == DecodeLayout(1, True)  # nothing to split
    split_only, faster = answering(True)
    assert decode_layout(2, column_major=False, faster=faster) == DecodeLayout(2, False)
    assert len(one_thread) == len(split_only) == 1


@pytest.mark.parametrize("split", [True, False])
def test_column_major_is_timed_against_the_split_chosen(monkeypatch, split):
    """The row-major side of the second question computes its products as the layout would:
    split where the first answer chose the split."""
    seen = []
    real = layers.split_product
    monkeypatch.setattr(layers, "split_product",
                        lambda x, w, b, parts: seen.append(parts) or real(x, w, b, parts))

    def faster(a, b) -> bool:
        if len(asked) == 1:
            b()  # the row-major products of 1 and 16 rows
        asked.append(a)
        return split

    asked: list = []
    decode_layout(2, faster=faster)
    assert seen == ([2] * 2 * profile.PROBE_COUNT if split else [])


def test_layout_for_a_model_without_large_float32_weights_times_nothing(monkeypatch, no_clock):
    monkeypatch.setattr(profile, "decode_layout", lambda *a, **k: pytest.fail("timed"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(layers.Linear(16, 32))  # below SPLIT_MIN_WEIGHTS
    assert layout_for(model) == DecodeLayout()


def test_a_layout_says_itself_in_a_phrase():
    assert DecodeLayout(2).describe() == "decode products split over 2 threads"
    assert DecodeLayout(2, True).describe() == "decode weights column-major"
    assert DecodeLayout().describe() == "decode products unsplit"


def test_faster_compares_medians_of_calls_taken_in_turn():
    """One slow call of the faster function (a neighbour's burst) does not flip the answer, and
    the calls alternate, so a machine whose speed drifts slows both alike."""
    calls = []

    def sleeper(name, seconds):  # each call sleeps the next of seconds (an untimed one first)
        def f():
            calls.append(name)
            time.sleep(seconds.pop(0))
        return f

    quick = sleeper("a", [0, 0, 0, 0.05, 0, 0, 0, 0])
    assert profile.faster(quick, sleeper("b", [0.002] * 8)) is True
    assert calls == ["a", "b"] * 8
    assert profile.faster(sleeper("c", [0.002] * 8), sleeper("d", [0] * 8)) is False


def test_probe_weights_outgrow_a_last_level_cache_of_32_mib():
    ws = profile.probe_weights()
    assert ws.dtype is torch.float32 and ws.numel() * 4 > 32 << 20
