"""`charlm info`: a run's, an export's or a config's parameters, FLOPs and shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from charlm.cli.options import SetOpt, command_app
from charlm.core.errors import CharlmError

app = command_app()

@app.command()
def info(
    target: Annotated[
        Path, typer.Argument(metavar="RUN_DIR_OR_CKPT_OR_CONFIG",
                             help="A run dir, a checkpoint, a `charlm export --format "
                                  "safetensors` directory or a YAML config.")
    ],
    set_: SetOpt = None,
    vocab_size: Annotated[
        int | None, typer.Option(help="Vocab size for a GPT config (default: from its data).")
    ] = None,
    shapes: Annotated[
        bool, typer.Option("--shapes", help="Also list the tensor shape at each forward stage.")
    ] = False,
    batch: Annotated[
        int | None, typer.Option(help="Batch size for --shapes (default: train.batch_size).")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option(help="Sequence length for --shapes (default: block_size).")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Parameter table per component, FLOPs per token, forward shapes and the resolved config.
    A config's vocabulary comes from data.path (an encoder-decoder's two from its pairs)."""
    from charlm.config.loading import is_config_file, load_config
    from charlm.config.values import dump_yaml
    from charlm.export import is_export_dir, load_safetensors
    from charlm.info.summary import config_model, describe, render_text
    from charlm.training.checkpoint import load_model

    train_state = None
    if vocab_size is not None and vocab_size < 1:
        raise CharlmError(f"--vocab-size must be >= 1, got {vocab_size}")
    if not shapes and (batch is not None or seq_len is not None):
        given = "--batch" if batch is not None else "--seq-len"
        raise CharlmError(f"{given} sizes the forward pass of --shapes; add --shapes")
    if is_config_file(target):
        cfg = load_config(target, list(set_ or []))
        model = config_model(cfg, vocab_size)  # one block per stack, on the meta device
    else:
        if set_ or vocab_size is not None:
            given = "--set" if set_ else "--vocab-size"
            raise CharlmError(f"{given} applies to a config file, not to a checkpoint")
        if is_export_dir(target):  # an export has no training progress to show
            model, _, cfg = load_safetensors(target)
        else:
            model, _, cfg, state = load_model(target)
            train_state = state["train_state"]
    size = (cfg.train.batch_size if batch is None else batch,
            cfg.model.block_size if seq_len is None else seq_len) if shapes else None
    report = describe(model, cfg, size, train_state)
    if json_:
        print(json.dumps(report, indent=2))
        return
    print(render_text(report))
    print("\nconfig:")
    print("  " + dump_yaml(report["config"]).replace("\n", "\n  ").rstrip())
