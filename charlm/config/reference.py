"""docs/config.md rendered from the schema (each section's docstring, each key's type, default
and help), so the reference says what the code does; a test fails when it is out of date."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from charlm.config.schema import RunConfig

COMMAND = "python scripts/config_docs.py"

INTRO = f"""\
# Configuration

<!-- Generated from charlm/config/schema.py by `{COMMAND}`; edit the help there. -->

A run's config is YAML with four sections, `model`, `optim`, `train` and `data`. Each key's
default is below; a YAML file (`charlm train my.yaml`) overrides the defaults, and
`--set section.key=value` (repeatable) overrides both: CLI > YAML > defaults. Each value is read
by its key's type (`3e-4` is a float, `010` is ten for an integer and stays `010` for a
string, `null` clears an optional key). An unknown key is refused with the nearest valid name,
and a key given twice is an error. The resolved config is saved as the run dir's `config.yaml`
and in every checkpoint; on `--resume` the `model` section comes from the checkpoint.
"""


def type_name(hint: Any) -> str:
    """A key's type as a YAML reader thinks of it: `int`, `float or null`, `one of a, b`."""
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(str(choice) for choice in typing.get_args(hint))
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        names = [type_name(arg) if arg is not type(None) else "null"
                 for arg in typing.get_args(hint)]
        return ", ".join(names[:-1]) + " or " + names[-1]
    return {str: "string", int: "int", float: "float", bool: "bool"}.get(hint, str(hint))


def yaml_value(value: Any) -> str:
    """A default as YAML writes it: null, true, 0.004, and a string with a tab quoted."""
    if value is None or isinstance(value, bool) or (isinstance(value, str)
                                                   and not value.isprintable()):
        return json.dumps(value)
    return str(value)


def cell(text: str) -> str:
    """Table cell text: a `|` would end the cell."""
    return text.replace("|", "\\|")


def config_reference() -> str:
    """docs/config.md as the schema gives it now."""
    lines = [INTRO]
    hints = typing.get_type_hints(RunConfig)
    for section in dataclasses.fields(RunConfig):
        cls = hints[section.name]
        lines += [f"## `{section.name}`", "", " ".join((cls.__doc__ or "").split()), "",
                  "| key | type | default | meaning |", "|---|---|---|---|"]
        key_hints = typing.get_type_hints(cls)
        for key in dataclasses.fields(cls):
            if "help" not in key.metadata:
                raise ValueError(f"{section.name}.{key.name} has no help; declare it with setting")
            lines.append(f"| `{section.name}.{key.name}` | {cell(type_name(key_hints[key.name]))} "
                         f"| `{cell(yaml_value(key.default))}` | {cell(key.metadata['help'])} |")
        lines.append("")
    return "\n".join(lines)
