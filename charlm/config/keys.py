"""How a config section declares its keys: `setting` (a default with its help, which
`charlm.config.reference` renders into docs/config.md) and `require` (a validation that fails as
one `invalid config value` error)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from charlm.core.errors import CharlmError


def setting(default: Any, help: str) -> Any:
    """A config key with its default and its help: what `docs/config.md` says it means
    (`charlm.config.reference` renders it; `SampleConfig`'s options declare theirs the same way)."""
    return field(default=default, metadata={"help": help})


def require(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise CharlmError(f"invalid config value {key}: {msg}")
