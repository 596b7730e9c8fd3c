"""YAML as charlm reads it: PyYAML's safe loader with every plain (unquoted) scalar kept as its
text (`PlainScalar`), so that a config field's type says how to read it (`values.coerce`);
YAML 1.2's plain scalars (`plain_value`); a writer whose strings read back as strings; config
files read with their size capped and errors in one line."""

from __future__ import annotations

import math
import re
import sys
import typing
from pathlib import Path
from typing import Any

import yaml

from charlm.core.errors import CharlmError
from charlm.core.files import missing, read_regular


class PlainScalar(str):
    """A plain (unquoted) YAML scalar's source text; its field's type says how to read it."""


class _Loader(yaml.SafeLoader):
    """yaml.safe_load with plain scalars kept as `PlainScalar`s, and a key given twice in one
    mapping an error (PyYAML keeps the last one: a second `optim:` would reset the first's)."""

    yaml_implicit_resolvers = {  # only `<<` (merge keys): no plain scalar gets a type here
        first: [(tag, regex) for tag, regex in resolvers if tag == "tag:yaml.org,2002:merge"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_yaml_str(self, node: yaml.ScalarNode) -> str:
        text = self.construct_scalar(node)
        return PlainScalar(text) if node.style is None else text

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
    """The number of values `node` expands to, aliases in full (each node counted once); a
    YAMLError beyond MAX_VALUES or MAX_DEPTH."""
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
    (`1e5`, `0o17`), so the config means the same to any YAML tool."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        node = super().represent_str(data)
        if plain_value(data) != data:
            node.style = "'"
        return node


_Dumper.add_representer(str, _Dumper.represent_str)


def load_text(text: str) -> Any:
    """YAML text as data, each plain scalar a `PlainScalar`."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # PyYAML's parser recurses per level, before the loader can count
        raise yaml.YAMLError(f"values nested more than {MAX_DEPTH} levels deep") from None


def dump_yaml(data: Any) -> str:
    """YAML text that `load_text` and `untext` read back as `data` (keys in their order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


# How YAML 1.2's core schema reads a plain scalar (with YAML 1.1's yes/no/on/off, as PyYAML read
# them), the first match winning; underscores may follow any digit (`1_000`, `0x_ff`).
_INT = re.compile(r"[-+]?(?:0b[01_]*[01][01_]*|0o[0-7_]*[0-7][0-7_]*"
                  r"|0x[0-9a-fA-F_]*[0-9a-fA-F][0-9a-fA-F_]*|[0-9][0-9_]*)")
_FLOAT = re.compile(r"[-+]?(?:\.[0-9_]*[0-9][0-9_]*|[0-9][0-9_]*(?:\.[0-9_]*)?)"
                    r"(?:[eE][-+]?[0-9_]*[0-9][0-9_]*)?")
_INF_NAN = re.compile(r"[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)")


def _int(text: str) -> int | float:
    """Decimal (`010` is ten), or `0b` / `0o` / `0x`, with a sign; one of more digits than
    Python converts is infinity, as YAML's float rules read it."""
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
    """A plain scalar's text as YAML 1.2 reads it: null, a bool, an int, a float or the text."""
    for pattern, read in _PLAIN:
        if pattern.fullmatch(text):
            return read(text)
    return str(text)


def too_large(text: str) -> bool:
    """Whether `text` is a number past the largest float (`1e999`, which YAML reads as inf)."""
    value = plain_value(text)
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and abs(value) > sys.float_info.max and not _INF_NAN.fullmatch(text))


def untext(value: Any) -> Any:
    """`value` with each plain scalar typed as YAML reads it."""
    if isinstance(value, PlainScalar):
        return plain_value(value)
    if isinstance(value, list):
        return [untext(v) for v in value]
    if isinstance(value, dict):
        return {untext(k): untext(v) for k, v in value.items()}
    return value


def as_mapping(raw: Any, must: str) -> dict[str, Any]:
    """`raw` as a dict ({} for nothing: an empty YAML file), else the error `must, got TYPE`."""
    if isinstance(raw, PlainScalar):
        raw = plain_value(raw)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CharlmError(f"{must}, got {type(raw).__name__}")
    return raw


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
