"""Config values: YAML read by PyYAML's safe loader with every plain scalar kept as its text,
and `coerce`, which reads a value by the type of the dataclass field it is for (`010` is ten for
an integer, `08` a path for a string), by the table of YAML 1.2's plain scalars (`_PLAIN`).
`charlm.config.loading` reads files with them and `charlm.config.schema` types the run's config.
"""

from __future__ import annotations

import math
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from charlm.core.errors import CharlmError
from charlm.core.files import missing, read_regular


class Text(str):
    """A plain (unquoted) YAML scalar's source text; its field's type says how to read it."""


class _Loader(yaml.SafeLoader):
    """yaml.safe_load that keeps every plain scalar as its text (`Text`), so that `coerce` reads
    it by its field's type: `010` for an integer is ten, `08` for a path stays "08". Quoted
    scalars stay strings. A key given twice in one mapping is an error (PyYAML keeps the last one
    silently, so a second `optim:` section would reset the first one's keys to their defaults)."""

    yaml_implicit_resolvers = {  # only `<<` (merge keys): no plain scalar gets a type here
        first: [(tag, regex) for tag, regex in resolvers if tag == "tag:yaml.org,2002:merge"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        text = self.construct_scalar(node)
        return Text(text) if node.style is None else text

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key '{key}'", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node, 0, {})
        return super().construct_document(node)


_Loader.add_constructor("tag:yaml.org,2002:str", _Loader.construct_yaml_str)


# A config is a few dozen values a few levels deep; aliases that expand far beyond that (a
# "billion laughs") would hang whatever walks the expanded data.
MAX_VALUES, MAX_DEPTH = 10_000, 32


def _check_expansion(node: yaml.Node, depth: int, counted: dict[int, int]) -> int:
    """The number of values `node` expands to, each alias counted in full (once per node:
    `counted`); a YAMLError beyond MAX_VALUES or MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise yaml.constructor.ConstructorError(
            None, None, f"values nested more than {MAX_DEPTH} levels deep", node.start_mark)
    if id(node) not in counted:
        children = (node.value if isinstance(node, yaml.SequenceNode) else
                    [n for pair in node.value for n in pair]
                    if isinstance(node, yaml.MappingNode) else [])
        counted[id(node)] = 1 + sum(_check_expansion(c, depth + 1, counted) for c in children)
        if counted[id(node)] > MAX_VALUES:
            raise yaml.constructor.ConstructorError(
                None, None, f"aliases expand to more than {MAX_VALUES:,} values",
                node.start_mark)
    return counted[id(node)]


class _Dumper(yaml.SafeDumper):
    """yaml.safe_dump that quotes every string a YAML 1.2 reader would take for something else
    (`1e5`, `0o17`), so the config `charlm info` prints means the same to any YAML tool."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        node = super().represent_str(data)
        if plain_value(data) != data:
            node.style = "'"
        return node


_Dumper.add_representer(str, _Dumper.represent_str)


def load_text(text: str) -> Any:
    """YAML text as data, each plain scalar kept as its text (`Text`)."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # PyYAML's parser recurses per level, before the loader can count
        raise yaml.YAMLError(f"values nested more than {MAX_DEPTH} levels deep") from None


def parse_yaml(text: str) -> Any:
    """YAML text as data, each plain scalar typed as YAML 1.2 reads it (see `plain_value`)."""
    return untext(load_text(text))


def dump_yaml(data: Any) -> str:
    """YAML text that `parse_yaml` reads back as `data` (keys in their order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


# How YAML 1.2's core schema reads a plain scalar (with YAML 1.1's yes/no/on/off, as PyYAML read
# them), the first match winning; underscores may follow any digit (`1_000`, `0x_ff`).
_INT = re.compile(r"[-+]?(?:0b[01_]*[01][01_]*|0o[0-7_]*[0-7][0-7_]*"
                  r"|0x[0-9a-fA-F_]*[0-9a-fA-F][0-9a-fA-F_]*|[0-9][0-9_]*)")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9_]*[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)"
                    r"(?:[eE][-+]?[0-9_]*[0-9][0-9_]*)?")
_INF_NAN = re.compile(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")


def _int(text: str) -> int | float:
    """Decimal (leading zeros allowed: `010` is ten), or `0b` / `0o` / `0x`, with a sign. One of
    more digits than Python converts is infinity, as YAML's float rules read it."""
    digits = text.replace("_", "")
    sign, body = (-1, digits[1:]) if digits[0] == "-" else (1, digits.lstrip("+"))
    base = {"0b": 2, "0o": 8, "0x": 16}.get(body[:2])
    try:
        return sign * (int(body[2:], base) if base else int(body))
    except ValueError:
        return sign * math.inf


_PLAIN: tuple[tuple[re.Pattern[str], typing.Callable[[str], Any]], ...] = (
    (re.compile(r"~|null|Null|NULL|"), lambda text: None),
    (re.compile(r"yes|Yes|YES|true|True|TRUE|on|On|ON"), lambda text: True),
    (re.compile(r"no|No|NO|false|False|FALSE|off|Off|OFF"), lambda text: False),
    (_INT, _int),
    (_FLOAT, lambda text: float(text.replace("_", ""))),
    (_INF_NAN, lambda text: float(text.replace(".", ""))),
)


def plain_value(text: str) -> Any:
    """A plain scalar's text as YAML 1.2 reads it: null, a bool, an integer, a float or the
    text itself. Error messages show a value the way a YAML reader sees it."""
    for pattern, read in _PLAIN:
        if pattern.fullmatch(text):
            return read(text)
    return str(text)


def _too_large(text: Text) -> bool:
    """Whether `text` is a number beyond the largest float (`1e999`, an integer of thousands of
    digits), which YAML's rules read as infinity."""
    value = plain_value(text)
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and abs(value) > sys.float_info.max and not _INF_NAN.fullmatch(text))


def untext(value: Any) -> Any:
    """`value` with each plain scalar's text as YAML reads it (`plain_value`)."""
    if isinstance(value, Text):
        return plain_value(value)
    if isinstance(value, list):
        return [untext(v) for v in value]
    if isinstance(value, dict):
        return {untext(k): untext(v) for k, v in value.items()}
    return value


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
    """`value` as the type `tp` (one of a union's, not a tuple), or `_NO` where it is not one."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    fits = {type(None): value is None, bool: isinstance(value, bool), str: isinstance(value, str),
            int: number and isinstance(value, int), float: number}.get(tp)
    if typing.get_origin(tp) is Literal:
        fits = isinstance(value, str) and value in typing.get_args(tp)
    if not fits:
        return _NO
    return float(value) if tp is float else str(value) if tp is str else value


def _read(text: Text, tp: Any) -> Any:
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
    """Return `value` as type `tp`, or raise a CharlmError that says what is allowed. A plain
    YAML scalar's text is read by `tp` first (`_read`)."""
    at = f" in {where}" if where else ""
    if isinstance(value, Text):
        if str not in _options(tp) and _too_large(value):
            number = value if len(value) <= 20 else f"{value[:20]}... ({len(value):,} characters)"
            raise CharlmError(f"invalid value for {key}{at}: {number} is a number too large to "
                              "read; give a smaller one")
        value = _read(value, tp)
    for arg in _options(tp):
        if typing.get_origin(arg) is tuple and isinstance(value, (list, tuple)):
            return tuple(coerce(item, typing.get_args(arg)[0], key, where) for item in value)
        got = _as(value, arg)
        if isinstance(got, float) and not math.isfinite(got):
            # A NaN fails every range check, but an infinite lr or weight decay would pass them.
            raise CharlmError(f"invalid value for {key}{at}: {value}, expected a finite number")
        if got is not _NO:
            return got
    raise CharlmError(
        f"invalid value for {key}{at}: {shown(untext(value))}, expected {_type_name(tp)}")


def shown(value: Any, limit: int = 80) -> str:
    """repr(value), cut to about `limit` characters: an error line stays one line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


# A config is a few dozen lines: a file far larger is a mistake, which would fill the memory
CONFIG_LIMIT = 1 << 20


def read_yaml_file(path: Path) -> Any:
    if not path.exists():
        raise missing(path, "config file")
    if path.is_dir():
        raise CharlmError(f"config path is a directory, not a YAML file: {path}")
    try:
        text = read_regular(path, "config file", CONFIG_LIMIT).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CharlmError(f"config file is not UTF-8 text: {path} (byte {e.start})") from None
    try:
        return load_text(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if "'\\t'" in problem:
            problem += "; YAML indents with spaces, not tabs"
        raise CharlmError(f"YAML syntax error in {path}{at}: {problem}") from None
