"""`charlm export`: a model as safetensors, a Hugging Face GPT-2 directory, or ONNX graphs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from charlm.cli.options import StepOpt, TargetArg
from charlm.core.errors import CharlmError


def export(
    target: TargetArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write.")],
    format_: Annotated[
        str, typer.Option("--format", help="safetensors (charlm, pickle-free), hf "
                          "(transformers GPT-2 + tokenizer) or onnx (ONNX Runtime, no torch: "
                          "charlm.onnx).")
    ] = "safetensors",
    overwrite: Annotated[
        bool, typer.Option(help="Replace an earlier export in --out (a directory holding "
                           "anything else is refused).")
    ] = False,
    step: StepOpt = None,
) -> None:
    """Export a model as safetensors, a Hugging Face GPT-2 directory, or ONNX graphs."""
    from charlm.api import load
    from charlm.export import FORMATS, export_model, export_notes

    if format_ not in FORMATS:
        *others, last = FORMATS
        raise CharlmError(f"--format must be {', '.join(others)} or {last}, got {format_!r}")
    lm = load(target, "cpu", step=step)
    export_model(lm.model, lm.vocab, lm.config, lm.source, out, format_, overwrite)
    print(f"wrote {out} ({format_})")
    for note in export_notes(format_, lm.config, lm.vocab):
        print(note)
