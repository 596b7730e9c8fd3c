"""Config values: YAML read with every plain scalar kept as its text, and `coerce`, which reads
a value by the type of the dataclass field it is for (`010` is ten for an integer, `08` a path
for a string). `charlm.config.loading` reads files with them and `charlm.config.schema` types
the values of the run's config.
"""

from __future__ import annotations

import math
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


_NULL = ("", "~", "null", "Null", "NULL")


_BOOL = {form: value for value, words in ((True, "yes true on"), (False, "no false off"))
         for word in words.split() for form in (word, word.capitalize(), word.upper())}


_INF = {f"{sign}.{inf}": float(f"{sign}inf") for sign in ("", "+", "-")
        for inf in ("inf", "Inf", "INF")}


_NAN = (".nan", ".NaN", ".NAN")


def _null(text: str) -> None:
    if text not in _NULL:
        raise ValueError(text)


def _bool(text: str) -> bool:
    return _BOOL[text]  # YAML 1.1's words, as PyYAML read them: yes/no and on/off too


def _digits(text: str) -> str:
    """`text` without its underscores, which may follow any digit (`1_000`, `0x_ff`)."""
    if not text.isascii() or text.lstrip("+-")[:1] == "_":
        raise ValueError(text)
    return text.replace("_", "")


def _int(text: str) -> int:
    """Decimal (leading zeros allowed: `010` is ten), or `0b` / `0o` / `0x`, with a sign."""
    digits = _digits(text)
    body = digits[1:] if digits[:1] in ("+", "-") else digits
    if not body.isalnum():  # int() would take spaces, and a second sign
        raise ValueError(text)
    return int(digits, 0 if body[:2] in ("0b", "0o", "0x") else 10)


def _float(text: str) -> float:
    """An integer, Python's float syntax with a digit in it (`1e-3`, `.5`), `.inf` or `.nan`."""
    if text in _INF or text in _NAN:
        return _INF.get(text, math.nan)
    try:
        return float(_int(text))
    except (ValueError, OverflowError):
        digits = _digits(text)
    if not any(c.isdigit() for c in digits):  # float() takes `inf`, `nan`, `infinity` too
        raise ValueError(text)
    return float(digits)


def too_large(text: str) -> bool:
    """Whether `text` is a number beyond the largest float (`1e999`, an integer of thousands of
    digits, which Python does not even convert to an int): YAML's rules read it as infinity."""
    try:
        digits = _digits(text)
        return any(c.isdigit() for c in digits) and math.isinf(float(digits))
    except ValueError:
        return False


def _str(text: str) -> str:
    if text in _NULL:  # no string: `coerce` reports it as None, as it does a null
        raise ValueError(text)
    return str(text)


_READERS: dict[Any, typing.Callable[[str], Any]] = {
    type(None): _null, bool: _bool, int: _int, float: _float, str: _str}


def plain_value(text: str) -> Any:
    """A plain scalar's text as YAML 1.2 reads it: null, a bool, an integer, a float or the
    text itself. Error messages show a value the way a YAML reader sees it."""
    for tp in (type(None), bool, int, float):
        try:
            return _READERS[tp](text)
        except (KeyError, ValueError):
            pass
    return str(text)


def _read(text: Text, tp: Any) -> Any:
    """`text` read by the grammar of type `tp` (of one of a union's types, in their order); where
    none fits, as YAML reads it, so that `coerce` names what is wrong."""
    for arg in typing.get_args(tp) if _is_union(tp) else (tp,):
        if typing.get_origin(arg) is Literal:
            if text in typing.get_args(arg):
                return str(text)
            continue
        try:
            return _READERS[arg](text)
        except (KeyError, ValueError):
            pass
    return plain_value(text)


def untext(value: Any) -> Any:
    """`value` with each plain scalar's text as YAML reads it (`plain_value`)."""
    if isinstance(value, Text):
        return plain_value(value)
    if isinstance(value, list):
        return [untext(v) for v in value]
    if isinstance(value, dict):
        return {untext(k): untext(v) for k, v in value.items()}
    return value


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if _is_union(tp):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"a list, each item {_type_name(typing.get_args(tp)[0])}"
    return {type(None): "null", int: "an integer", float: "a number", bool: "true/false",
            str: "a string"}.get(tp, str(tp))


def coerce(value: Any, tp: Any, key: str, where: str = "") -> Any:
    """Return `value` as type `tp`, or raise a CharlmError that says what is allowed. A plain
    YAML scalar's text is read by the grammar of `tp` first (`_read`)."""
    at = f" in {where}" if where else ""
    if isinstance(value, Text):
        if too_large(value) and str not in (typing.get_args(tp) if _is_union(tp) else (tp,)):
            number = value if len(value) <= 20 else f"{value[:20]}... ({len(value):,} characters)"
            raise CharlmError(f"invalid value for {key}{at}: {number} is a number too large to "
                              "read; give a smaller one")
        value = _read(value, tp)
    origin = typing.get_origin(tp)
    if _is_union(tp):
        for arg in typing.get_args(tp):
            try:
                return coerce(value, arg, key, where)
            except CharlmError:
                if arg is float and isinstance(value, float):  # NaN or inf: say so
                    raise
    elif origin is Literal:
        if value in typing.get_args(tp):
            return value
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif origin is tuple:  # tuple[X, ...], given as a list or a tuple
        if isinstance(value, (list, tuple)):
            return tuple(coerce(item, typing.get_args(tp)[0], key, where) for item in value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
            # A NaN fails every range check, but an infinite lr or weight decay would pass them.
            raise CharlmError(f"invalid value for {key}{at}: {value}, expected a finite number")
    elif tp is str and isinstance(value, str):
        return value
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
