"""How a config section declares its keys (`setting`) and checks them (`require`)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from charlm.core.errors import CharlmError


def setting(default: Any, help: str, flag: str | None = None) -> Any:
    """A key with its default and its help (docs/config.md's, or a sampling option's), and the
    option's `flag` where its name is not the field's."""
    return field(default=default, metadata={"help": help, "flag": flag})


def require(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise CharlmError(f"invalid config value {key}: {msg}")
