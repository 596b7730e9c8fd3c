"""Reading a run config (the defaults, a YAML file, `--set` overrides) and writing it."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import yaml

from charlm.config.schema import RunConfig
from charlm.config.yaml_files import as_mapping, dump_yaml, load_text, read_yaml_file
from charlm.core.errors import CharlmError
from charlm.core.files import write_text_atomic


def is_config_file(path: Path) -> bool:
    """Whether a command-line path names a YAML config (`.yaml` / `.yml`, in any case)."""
    return path.suffix.lower() in (".yaml", ".yml") and not path.is_dir()


Override = str | tuple[str, Any]  # "section.key=YAML text", or (section.key, value)


def dotted_key(item: Override) -> str:
    return item[0] if isinstance(item, tuple) else item.partition("=")[0].strip()


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[Override]) -> dict[str, Any]:
    """`raw` with the overrides set: a string's value read as YAML, a pair's taken as it is (an
    option's text). A key given twice is an error, as in a YAML file."""
    seen: set[str] = set()
    for item in overrides:
        dotted = dotted_key(item)
        section, dot, key = dotted.partition(".")
        if isinstance(item, tuple):
            value = item[1]
        else:
            text = item.partition("=")[2]
            if "=" not in item or not dot or not section or not key:
                raise CharlmError(
                    f"--set expects section.key=value, got {item!r} (e.g. --set optim.lr=1e-3)"
                )
            try:
                value = load_text(text) if text.strip() else None
            except yaml.YAMLError:
                value = text
        if dotted in seen:
            raise CharlmError(f"--set {dotted} is given twice; give it once")
        seen.add(dotted)
        section_raw = raw.setdefault(section, {})
        if not isinstance(section_raw, dict):
            raise CharlmError(f"cannot --set {dotted}: section '{section}' is not a mapping")
        section_raw[key] = value
    return raw


def load_config(path: str | Path | None = None,
                overrides: typing.Sequence[Override] = ()) -> RunConfig:
    """Defaults <- YAML file (if any) <- overrides (see `apply_overrides`), validated."""
    raw: Any = {}
    where = "the defaults"
    if path is not None:
        raw = read_yaml_file(Path(path))
        where = str(path)
        raw = as_mapping(raw, f"{path} must hold a mapping of sections (model, optim, train, data)")
    if overrides:
        raw = apply_overrides(raw, overrides)
        where = f"{where} with --set overrides" if path else "--set overrides"
    return RunConfig.from_dict(raw, where)


def save_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config, atomically (a resume rewrites it)."""
    write_text_atomic(path, dump_yaml(cfg.to_dict()))
