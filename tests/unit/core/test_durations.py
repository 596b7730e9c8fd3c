"""charlm.core.durations: durations such as 90, 5m or 1h30m, read into seconds and written back."""

import pytest

from charlm.config.loading import load_config
from charlm.core.durations import duration_seconds, format_duration
from charlm.core.errors import CharlmError


@pytest.mark.parametrize("text, seconds", [
    ("90", 90), ("30s", 30), ("5m", 300), ("2h", 7200), ("1h30m", 5400), ("1.5h", 5400),
    (" 2m 30s ", 150), (45, 45), (0.5, 0.5), ("8760h", 365 * 24 * 3600),
])
def test_durations(text, seconds):
    assert duration_seconds(text) == seconds


@pytest.mark.parametrize("text, message", [
    ("5 min", "invalid config value train.max_time: '5 min' is not a duration; give seconds or "
              "a number with s, m or h (90, 30s, 5m, 2h, 1h30m)"),
    ("m", "invalid config value train.max_time: 'm' is not a duration; give seconds or a "
          "number with s, m or h (90, 30s, 5m, 2h, 1h30m)"),
    ("0", "invalid config value train.max_time: must be a positive duration, got '0'"),
    (-3, "invalid config value train.max_time: must be a positive duration, got -3"),
    ("inf", "invalid config value train.max_time: must be a positive duration, got 'inf'"),
    ("99999999999999999999", "invalid config value train.max_time: must be at most a year "
                             "(8760h), got '99999999999999999999'"),
    ("8761h", "invalid config value train.max_time: must be at most a year (8760h), got "
              "'8761h'"),
])
def test_bad_durations_are_named(text, message):
    with pytest.raises(CharlmError) as e:
        duration_seconds(text)
    assert str(e.value) == message


def test_the_config_reads_a_duration_into_seconds():
    assert load_config(None, ["train.max_time=5m"]).train.max_time == 300.0
    assert load_config(None, ["train.max_time=90"]).train.max_time == 90.0
    assert load_config(None, []).train.max_time is None
    assert [format_duration(s) for s in (12.34, 90, 3725)] == ["12.3s", "1m30s", "1h02m05s"]


@pytest.mark.parametrize("seconds, text", [
    (0, "0.0s"), (-1.0, "0.0s"), (12.34, "12.3s"), (59.4, "59.4s"), (60, "1m00s"), (90, "1m30s"),
    (3599, "59m59s"), (3600, "1h00m00s"), (3725, "1h02m05s"), (90061, "25h01m01s"),
])
def test_format_duration_reads_back_as_its_seconds(seconds, text):
    """What charlm prints (a run's elapsed time, a budget) reads back as a duration: to a tenth
    of a second under a minute, to the second above."""
    assert format_duration(seconds) == text
    if seconds > 0:  # zero and less are no duration
        assert duration_seconds(text) == pytest.approx(round(seconds, 1 if seconds < 60 else 0))


def test_a_bad_duration_names_the_option_it_came_from():
    with pytest.raises(CharlmError) as e:
        duration_seconds("soon", key="--timeout")
    assert str(e.value).startswith("invalid config value --timeout: 'soon' is not a duration")
