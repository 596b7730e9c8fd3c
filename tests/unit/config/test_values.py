"""charlm.config.values: YAML values read and written as a YAML 1.2 reader types them."""

import math
from typing import Literal

import pytest

from charlm.config.loading import load_config
from charlm.config.values import coerce
from charlm.config.yaml_files import (
    PlainScalar,
    dump_yaml,
    load_text,
    plain_value,
    read_yaml_file,
    untext,
)
from charlm.core.errors import CharlmError


def test_number_lookalikes_without_a_digit_are_strings():
    """`._` (a string before YAML 1.2 numbers) and `0x_` matched the number syntax without a
    digit, so the loader failed in float('.') / int('', 16) with a ValueError traceback; they
    are strings, which the config then refuses in one line."""
    assert [untext(load_text(v)) for v in ("._", "-._", "0x_", "0b_", "0o_", "._5")] == [
        "._", "-._", "0x_", "0b_", "0o_", 0.5]
    with pytest.raises(CharlmError) as e:
        load_config(None, ["train.max_iters=._"])
    assert str(e.value) == ("invalid value for train.max_iters in --set overrides: '._', "
                            "expected an integer")


def test_dump_yaml_quotes_what_a_yaml_reader_would_type():
    assert dump_yaml({"a": "1e5", "b": "0o17", "c": "x", "d": 2}) == (
        "a: '1e5'\nb: '0o17'\nc: x\nd: 2\n")


@pytest.mark.parametrize("text, value", [
    ("010", 10), ("+12", 12), ("-0x_1f", -31), ("0b101", 5), ("0o17", 15), ("1_000", 1000),
    ("1e3", 1000.0), (".5", 0.5), ("1_0e-2_0", 1e-19), ("-.Inf", -math.inf), (".inf", math.inf),
    ("yes", True), ("Off", False), ("TRUE", True), ("~", None), ("", None), ("null", None),
    ("1:30", "1:30"), ("inf", "inf"), ("_1", "_1"), ("0X10", "0X10"), ("１２", "１２"),
    ("1 2", "1 2"), ("--1", "--1"), ("a: b", "a: b"),
])
def test_a_plain_scalar_is_what_yaml_1_2_reads(text, value):
    """Decimal with leading zeros, 0b / 0o / 0x with underscores, floats with a digit, YAML
    1.1's yes/no/on/off, null's spellings; anything else (full-width digits, `inf`) is text."""
    assert plain_value(text) == value and type(plain_value(text)) is type(value)


def test_nan_has_three_spellings():
    assert all(math.isnan(plain_value(text)) for text in (".nan", ".NaN", ".NAN"))
    assert plain_value("nan") == "nan"


def test_load_text_keeps_plain_scalars_as_text_and_quoted_ones_as_strings():
    data = load_text("a: 010\nb: '010'\nc: [08, \"yes\", yes]\n")
    assert data == {"a": "010", "b": "010", "c": ["08", "yes", "yes"]}
    assert isinstance(data["a"], PlainScalar) and not isinstance(data["b"], PlainScalar)
    assert [isinstance(v, PlainScalar) for v in data["c"]] == [True, False, True]
    assert untext(data) == {"a": 10, "b": "010", "c": [8, "yes", True]}


@pytest.mark.parametrize("text, tp, value", [
    ("010", int, 10), ("08", str, "08"), ("1", float, 1.0), ("yes", bool, True),
    ("~", int | None, None), ("12", int | None, 12), ("rope", Literal["learned", "rope"], "rope"),
    ("true", str, "true"), ("1e5", str, "1e5"), ("4", int | str, 4), ("auto", int | str, "auto"),
    ("300", float | str | None, 300.0), ("5m", float | str | None, "5m"),
    ("null", str | None, None), ("08", str | None, "08"),
])
def test_coerce_reads_a_plain_scalar_by_its_fields_type(text, tp, value):
    got = coerce(PlainScalar(text), tp, "key")
    assert got == value and type(got) is type(value)
    assert coerce([PlainScalar("a"), PlainScalar("010")], tuple[str, ...], "key") == ("a", "010")


@pytest.mark.parametrize("value, tp, message", [
    (PlainScalar("x"), int, "invalid value for model.n_layer in c.yaml: 'x', expected an integer"),
    (True, int, "invalid value for model.n_layer in c.yaml: True, expected an integer"),
    (PlainScalar("1.5"), int | None,
     "invalid value for model.n_layer in c.yaml: 1.5, expected an integer or null"),
    (PlainScalar(".inf"), float,
     "invalid value for model.n_layer in c.yaml: inf, expected a finite number"),
    (PlainScalar("alibi"), Literal["learned", "rope"],
     "invalid value for model.n_layer in c.yaml: 'alibi', expected one of 'learned', 'rope'"),
    ([1, PlainScalar("x")], tuple[int, ...],
     "invalid value for model.n_layer in c.yaml: 'x', expected an integer"),
])
def test_coerce_names_the_key_where_and_what_it_expected(value, tp, message):
    with pytest.raises(CharlmError) as e:
        coerce(value, tp, "model.n_layer", "c.yaml")
    assert str(e.value) == message


def test_dump_yaml_and_load_text_give_back_the_data():
    data = {"strings": ["1e5", "yes", "~", "08", "", " lead", "a: b", "- x", "0x1f"],
            "numbers": [1, -2.5, 1e-19], "flags": [True, False, None], "nested": {"k": "v"}}
    assert untext(load_text(dump_yaml(data))) == data


def test_read_yaml_file_refuses_a_directory_and_text_that_is_not_utf8(tmp_path):
    with pytest.raises(CharlmError) as e:
        read_yaml_file(tmp_path)
    assert str(e.value) == f"config path is a directory, not a YAML file: {tmp_path}"
    latin1 = tmp_path / "c.yaml"
    latin1.write_bytes("model:\n  norm: layernorm # café\n".encode("latin-1"))
    with pytest.raises(CharlmError) as e:
        read_yaml_file(latin1)
    assert str(e.value) == f"config file is not UTF-8 text: {latin1} (byte 30)"


def test_a_config_that_is_too_large_a_fifo_or_a_device_is_one_error(tmp_path):
    """A FIFO named config.yaml blocked `charlm train` forever; a symlink to /dev/zero filled the
    memory (MemoryError); a file of megabytes was read whole."""
    import os

    from tests.helpers import raised_reading_fifo

    big = tmp_path / "big.yaml"
    with open(big, "wb") as f:  # sparse: nothing is written
        f.truncate((1 << 20) + 1)
    with pytest.raises(CharlmError) as e:
        load_config(big)
    assert str(e.value) == (f"cannot read config file {big}: it holds more than 1 MiB, charlm's "
                            "limit for it; give a smaller one")
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    e = raised_reading_fifo(fifo, lambda: load_config(fifo))
    not_regular = "not a regular file (a directory, FIFO or device); give a regular file"
    assert str(e) == f"cannot read config file {fifo}: {not_regular}"
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    with pytest.raises(CharlmError) as e:
        load_config(zero)
    assert str(e.value) == f"cannot read config file {zero}: {not_regular}"


@pytest.mark.parametrize("text, tp, shown_as", [
    ("9" * 5000, int, "99999999999999999999... (5,000 characters)"),
    ("-" + "9" * 5000, int | None, "-9999999999999999999... (5,001 characters)"),
    ("1" + "0" * 400, float, "10000000000000000000... (401 characters)"),
    ("1e999", float, "1e999"),
])
def test_a_number_too_large_to_read_says_so(text, tp, shown_as):
    """A 5,000-digit integer in a --set was "inf, expected an integer": Python refuses to convert
    it, so YAML's float rules read it as infinity."""
    with pytest.raises(CharlmError) as e:
        coerce(PlainScalar(text), tp, "model.n_layer", "c.yaml")
    assert str(e.value) == (f"invalid value for model.n_layer in c.yaml: {shown_as} is a number "
                            "too large to read; give a smaller one")
    assert coerce(PlainScalar(text), str | None, "data.path") == text  # a name, not a number
