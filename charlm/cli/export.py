"""`charlm export`: a model as safetensors, or as a Hugging Face GPT-2 directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from charlm.cli.options import StepOpt, TargetArg, command_app
from charlm.core.errors import CharlmError

app = command_app()

@app.command()
def export(
    target: TargetArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write.")],
    format_: Annotated[
        str, typer.Option("--format", help="safetensors (charlm, pickle-free) or hf "
                          "(transformers GPT-2 + tokenizer).")
    ] = "safetensors",
    overwrite: Annotated[
        bool, typer.Option(help="Replace an earlier export in --out (a directory holding "
                           "anything else is refused).")
    ] = False,
    step: StepOpt = None,
) -> None:
    """Export a model as safetensors, or as a Hugging Face GPT-2 directory."""
    from charlm.api import load
    from charlm.export import FORMATS, export_model, export_notes

    if format_ not in FORMATS:
        raise CharlmError(f"--format must be {' or '.join(FORMATS)}, got {format_!r}")
    lm = load(target, "cpu", step=step)
    export_model(lm.model, lm.vocab, lm.config, lm.source, out, format_, overwrite)
    print(f"wrote {out} ({format_})")
    for note in export_notes(format_, lm.config, lm.vocab):
        print(note)
