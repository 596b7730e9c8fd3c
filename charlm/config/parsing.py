"""From plain data (a YAML file's, a checkpoint's) to a config section: unknown keys refused
with the nearest valid name, each value read by its field's type."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from charlm.config.values import coerce
from charlm.config.yaml_files import PlainScalar, plain_value
from charlm.core.errors import CharlmError


def suggest(name: str, valid: typing.Iterable[str]) -> str:
    """The end of an unknown name's message: the nearest valid name, else all of them."""
    valid = list(valid)
    close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.5)
    if close:
        return f", did you mean '{close[0]}'?"
    return f"; valid names are: {', '.join(valid)}"


def as_mapping(raw: Any, must: str) -> dict[str, Any]:
    """`raw` as a dict (empty for nothing, as an empty YAML file is), else the error
    `must, got TYPE`."""
    if isinstance(raw, PlainScalar):
        raw = plain_value(raw)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise CharlmError(f"{must}, got {type(raw).__name__}")
    return raw


def build_section(section_cls: type, section: str, raw: Any, where: str) -> Any:
    """One section's dataclass from its keys, each value read by its field's type."""
    raw = as_mapping(raw, f"section '{section}' in {where} must be a mapping of keys")
    hints = typing.get_type_hints(section_cls)
    kwargs = {}
    for key, value in raw.items():
        if key not in hints:
            raise CharlmError(
                f"unknown key '{section}.{key}' in {where}{suggest(key, hints)}"
            )
        value = coerce(value, hints[key], f"{section}.{key}", where)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            # torch sizes and steps are 64-bit
            raise CharlmError(f"invalid value for {section}.{key} in {where}: {value} is too large")
        kwargs[key] = value
    return section_cls(**kwargs)
