"""A config key: declared with its default and help (`setting`), its value read from plain data
by its field's type (`coerce`), and checked (`require`), each error naming the key and where."""

from __future__ import annotations

import math
import types
import typing
from dataclasses import field
from typing import Any, Literal

from charlm.config.yaml_files import PlainScalar, plain_value, too_large, untext
from charlm.core.errors import CharlmError, Setting, SettingError, shown


def setting(default: Any, help: str, flag: str | None = None) -> Any:
    """A key with its default and its help (docs/config.md's, or a sampling option's), and the
    option's `flag` where its name is not the field's."""
    return field(default=default, metadata={"help": help, "flag": flag})


def require(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise CharlmError(f"invalid config value {key}: {msg}")


def _options(tp: Any) -> tuple[Any, ...]:
    """A union's types in their order; any other type alone."""
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    return typing.get_args(tp) if union else (tp,)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if len(_options(tp)) > 1:
        return " or ".join(_type_name(a) for a in _options(tp))
    if typing.get_origin(tp) is tuple:
        return f"a list, each item {_type_name(typing.get_args(tp)[0])}"
    return {type(None): "null", int: "an integer", float: "a number", bool: "true/false",
            str: "a string"}.get(tp, str(tp))


_NO = object()


def _as(value: Any, tp: Any) -> Any:
    """`value` as the type `tp` (not a union or tuple), or `_NO` where it is not one."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    fits = {type(None): value is None, bool: isinstance(value, bool), str: isinstance(value, str),
            int: number and isinstance(value, int), float: number}.get(tp)
    if typing.get_origin(tp) is Literal:
        fits = isinstance(value, str) and value in typing.get_args(tp)
    if not fits:
        return _NO
    return float(value) if tp is float else str(value) if tp is str else value


def _read(text: PlainScalar, tp: Any) -> Any:
    """A plain scalar's text as the first of `tp`'s types that reads it: as text where that type
    takes text (`08` for a path), else as YAML reads it (`010` for an integer is ten)."""
    value = plain_value(text)
    for arg in _options(tp):
        if value is not None and _as(str(text), arg) is not _NO:
            return str(text)
        if _as(value, arg) is not _NO:
            return value
    return value


def coerce(value: Any, tp: Any, key: str, where: str = "") -> Any:
    """`value` as type `tp`, or a SettingError naming `key` that says what is allowed."""
    at = f" in {where}" if where else ""
    if isinstance(value, PlainScalar):
        if str not in _options(tp) and too_large(value):
            number = value if len(value) <= 20 else f"{value[:20]}... ({len(value):,} characters)"
            raise SettingError("invalid value for ", Setting(key), f"{at}: {number} is a number "
                               "too large to read; give a smaller one")
        value = _read(value, tp)
    for arg in _options(tp):
        if typing.get_origin(arg) is tuple and isinstance(value, (list, tuple)):
            return tuple(coerce(item, typing.get_args(arg)[0], key, where) for item in value)
        got = _as(value, arg)
        if isinstance(got, float) and not math.isfinite(got):
            # A NaN fails every range check, but an infinite lr or weight decay would pass them.
            raise SettingError("invalid value for ", Setting(key),
                               f"{at}: {value}, expected a finite number")
        if got is not _NO:
            return got
    raise SettingError("invalid value for ", Setting(key),
                       f"{at}: {shown(untext(value))}, expected {_type_name(tp)}")
