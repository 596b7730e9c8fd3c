"""charlm.config.sampling: the options of `charlm sample` and the API, validated and typed."""

from dataclasses import fields

import pytest

from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.5}, "temperature must be >= 0"),
    ({"top_k": 0}, "top_k must be >= 1"),
    ({"num_samples": 0}, "num_samples must be >= 1"),
    ({"max_new_tokens": -1}, "max_new_tokens must be >= 0"),
])
def test_sample_options_validated(kwargs, message):
    with pytest.raises(CharlmError, match=message):
        SampleConfig(**kwargs)


def test_a_temperature_past_100_is_refused_in_one_line():
    """`--temperature 1e46` on a byte model ended "its weights have diverged": 1/T is 0 in
    float32, times the UTF-8 mask's -inf NaN."""
    assert SampleConfig(temperature=100).temperature == 100
    with pytest.raises(CharlmError) as e:
        SampleConfig(temperature=1e46)
    assert str(e.value) == ("temperature must be <= 100 (past it every character is about "
                            "as likely as any other), got 1e+46")


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": "10"}, "invalid value for max_new_tokens: '10', expected an integer"),
    ({"max_new_tokens": True}, "invalid value for max_new_tokens: True, expected an integer"),
    ({"top_k": 2.5}, "invalid value for top_k: 2.5, expected an integer or null"),
    ({"temperature": "0.5"}, "invalid value for temperature: '0.5', expected a number"),
    ({"top_p": float("nan")}, "invalid value for top_p: nan, expected a finite number"),
    ({"seed": None}, "invalid value for seed: None, expected an integer"),
    ({"stop": ("ab", 5)}, "invalid value for stop: 5, expected a string"),
    ({"use_cache": "no"}, "invalid value for use_cache: 'no', expected true/false"),
])
def test_sample_options_of_the_wrong_type_are_named(kwargs, message):
    """The Python API passes options through untyped: a wrong type is a CharlmError naming the
    option, not a TypeError from a comparison or from torch deep inside sampling."""
    with pytest.raises(CharlmError) as e:
        SampleConfig(**kwargs)
    assert str(e.value) == message


def test_sample_options_take_ints_for_floats_and_lists_for_stop():
    opts = SampleConfig(temperature=1, stop=["a", "b"])
    assert (type(opts.temperature), opts.stop) == (float, ("a", "b"))


def test_every_sample_option_has_help():
    assert all(f.metadata["help"] for f in fields(SampleConfig))
