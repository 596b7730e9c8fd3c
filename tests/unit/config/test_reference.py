"""docs/config.md, the config reference, is what the schema's dataclasses say now."""

from __future__ import annotations

import dataclasses

from charlm.config.reference import COMMAND, config_reference, type_name, yaml_value
from charlm.config.schema import RunConfig
from tests.helpers import ROOT

DOC = ROOT / "docs" / "config.md"


def test_config_md_is_what_the_schema_renders():
    assert DOC.read_text(encoding="utf-8") == config_reference(), (
        f"docs/config.md is out of date with charlm/config/schema.py; run `{COMMAND}`")


def test_every_key_is_documented_once_with_its_default():
    """Each section's every key has help and appears once, with the default the dataclass
    holds (the default is read from the code, never written twice)."""
    text = config_reference()
    for section in dataclasses.fields(RunConfig):
        for key in dataclasses.fields(section.default_factory()):
            row = f"| `{section.name}.{key.name}` |"
            assert text.count(row) == 1, row
            line = next(line for line in text.splitlines() if line.startswith(row))
            assert f"| `{yaml_value(key.default)}` |" in line.replace("\\|", "|")
            assert key.metadata["help"].replace("|", "\\|") in line


def test_types_and_defaults_read_as_yaml():
    assert [type_name(t) for t in (int, str, int | None, float | str | None)] == [
        "int", "string", "int or null", "float, string or null"]
    assert [yaml_value(v) for v in (None, True, 4e-3, "\t", "runs/x")] == [
        "null", "true", "0.004", '"\\t"', "runs/x"]
