"""charlm.runtime.decode_profile: the layout each answer of the timing gives, with the timing
injected (no clock read), the probes' shape, and `faster`'s medians of calls in turn."""

import itertools
import time

import pytest
import torch

from charlm.model import layers
from charlm.runtime import decode_profile
from charlm.runtime.decode_profile import DecodeLayout, decode_layout, layout_for

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
    assert seen == ([2] * 2 * decode_profile.PROBE_COUNT if split else [])


def test_layout_for_a_model_without_large_float32_weights_times_nothing(monkeypatch, no_clock):
    monkeypatch.setattr(decode_profile, "decode_layout", lambda *a, **k: pytest.fail("timed"))
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
    assert decode_profile.faster(quick, sleeper("b", [0.002] * 8)) is True
    assert calls == ["a", "b"] * 8
    assert decode_profile.faster(sleeper("c", [0.002] * 8), sleeper("d", [0] * 8)) is False


def test_probe_weights_outgrow_a_last_level_cache_of_32_mib():
    ws = decode_profile.probe_weights()
    assert ws.dtype is torch.float32 and ws.numel() * 4 > 32 << 20
