"""charlm.config.values: YAML values read and written as a YAML 1.2 reader types them."""

import pytest

from charlm.config.loading import load_config
from charlm.config.values import dump_yaml, parse_yaml
from charlm.core.errors import CharlmError


def test_number_lookalikes_without_a_digit_are_strings():
    """`._` (a string before YAML 1.2 numbers) and `0x_` matched the number syntax without a
    digit, so the loader failed in float('.') / int('', 16) with a ValueError traceback; they
    are strings, which the config then refuses in one line."""
    assert [parse_yaml(v) for v in ("._", "-._", "0x_", "0b_", "0o_", "._5")] == [
        "._", "-._", "0x_", "0b_", "0o_", 0.5]
    with pytest.raises(CharlmError) as e:
        load_config(None, ["train.max_iters=._"])
    assert str(e.value) == ("invalid value for train.max_iters in --set overrides: '._', "
                            "expected an integer")


def test_dump_yaml_quotes_what_a_yaml_reader_would_type():
    assert dump_yaml({"a": "1e5", "b": "0o17", "c": "x", "d": 2}) == (
        "a: '1e5'\nb: '0o17'\nc: x\nd: 2\n")
