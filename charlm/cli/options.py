"""What several commands share: each command's own Typer app (`command_app`), the options
declared once (`--set`, `--device`, `--dtype`, the target run), the sampling options made from
`SampleConfig`'s fields, and whether an option was left at its default."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from charlm.config.sampling import SampleConfig


def command_app() -> typer.Typer:
    """A Typer app that holds one command; `charlm.cli.app` loads it when the command runs."""
    return typer.Typer(add_completion=False, pretty_exceptions_enable=False,
                       rich_markup_mode=None)


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
    """Whether the command's `option` was left at its default (by the source's name: typer
    may bring its own copy of click)."""
    source = ctx.get_parameter_source(option)
    return source is None or source.name == "DEFAULT"


def with_sample_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` one option per `SampleConfig` field (name, default and help from the
    field), before its `stream` parameter; they arrive in its `**options` as the field takes
    them (`--no-cache` as use_cache=False)."""
    options, hints = [], typing.get_type_hints(SampleConfig)
    for f in dataclasses.fields(SampleConfig):
        flag, tp, default, convert = f.metadata["flag"], hints[f.name], f.default, None
        if typing.get_origin(tp) is tuple:  # repeatable; SampleConfig takes a list
            tp = list[typing.get_args(tp)[0]]
        elif (flag or "").startswith("--no-"):  # a flag that turns the field off
            default, convert = not default, turn_off
        option = typer.Option(*([flag] if flag else []), help=f.metadata["help"], callback=convert)
        options.append(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                         default=default, annotation=Annotated[tp, option]))
    params = [p for p in inspect.signature(command, eval_str=True).parameters.values()
              if p.kind is not inspect.Parameter.VAR_KEYWORD]
    at = [p.name for p in params].index("stream")
    command.__signature__ = inspect.Signature(params[:at] + options + params[at:])
    return command


def turn_off(value: bool) -> bool:
    return not value
