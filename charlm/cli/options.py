"""What several commands share: their Typer app, the options declared once (`--set`,
`--device`, `--dtype`, the target run, the sampling options of `SampleConfig`'s fields)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from charlm.config.sampling import SampleConfig

SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", metavar="SECTION.KEY=VALUE",
                 help="Override one config key (value parsed as YAML); repeatable."),
]
DEVICES = "auto, cpu, cuda (the first GPU), cuda:N or mps"
DeviceOpt = Annotated[str, typer.Option(help=f"{DEVICES}.", metavar="DEVICE")]
DtypeOpt = Annotated[str, typer.Option(
    metavar="DTYPE", help="The weights' dtype: float32 (as trained), bfloat16 or float16 (half "
    "the memory traffic, so faster batch-1 decoding; rounds the weights).")]
TargetArg = Annotated[
    Path, typer.Argument(metavar="RUN_DIR_OR_CKPT",
                         help="A run dir (uses best.pt, else last.pt), a .pt checkpoint, or a "
                         "directory from `charlm export --format safetensors`."),
]

StepOpt = Annotated[
    int | None,
    typer.Option(min=0, metavar="STEP",
                 help="Use the run dir's checkpoint of this step (checkpoints/step-NNNNNN.pt, "
                 "kept by train.keep_checkpoints) instead of best.pt."),
]


def is_default(ctx: typer.Context, option: str) -> bool:
    """Whether `option` was left at its default (by name: typer may bring its own click)."""
    source = ctx.get_parameter_source(option)
    return source is None or source.name == "DEFAULT"


SAMPLE_FIELDS = {f.name: f for f in dataclasses.fields(SampleConfig)}
SAMPLE_DEFAULTS = SampleConfig()


def sample_option(name: str) -> typer.models.OptionInfo:
    """SampleConfig's field `name` as an option (`--no-cache` is `use_cache`'s opposite)."""
    meta = SAMPLE_FIELDS[name].metadata
    flag = meta["flag"]
    off = (flag or "").startswith("--no-")
    return typer.Option(*([flag] if flag else []), help=meta["help"],
                        callback=(lambda value: not value) if off else None)


def flag(setting: str) -> str:
    """A setting a `SettingError` names, as the CLI calls it: a config key as it is, any other
    by its flag (`top_k`: `--top-k`)."""
    if "." in setting:
        return setting
    given = SAMPLE_FIELDS[setting].metadata["flag"] if setting in SAMPLE_FIELDS else None
    return given if given and not given.startswith("--no-") else "--" + setting.replace("_", "-")

