"""`charlm info`: a run's, an export's or a config's parameters, FLOPs and shapes, or those of
the model `charlm train` would build from the same argument (a config, text, or nothing)."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Annotated

import typer

from charlm.cli.options import SetOpt
from charlm.core.errors import CharlmError


def info(
    target: Annotated[
        Path | None, typer.Argument(
            metavar="[RUN_DIR_OR_CKPT_OR_CONFIG_OR_TEXT]", show_default=False,
            help="A run dir, a checkpoint (.pt), a `charlm export --format safetensors` "
                 "directory, or what `charlm train` takes: a YAML config, the data (a text file "
                 "or a dataset dir), or nothing for the built-in defaults.")
    ] = None,
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
    machine: Annotated[
        bool, typer.Option("--machine", help="Say what a run would compute with here (its "
                           "device, threads and dtype, as `train.*: auto` resolves them) and "
                           "why, instead.")
    ] = False,
) -> None:
    """Parameter table per component, FLOPs per token, forward shapes and the resolved config:
    of a trained model, or of the one `charlm train` would build from the same argument. Its
    vocabulary comes from data.path, read without writing anything (an encoder-decoder's two
    from its pairs)."""
    from charlm.api import load
    from charlm.cli.train import train_config
    from charlm.config.yaml_files import dump_yaml
    from charlm.data.datasets import data_summary
    from charlm.info.summary import config_model, describe, render_text
    from charlm.runtime.device import resolve_device
    from charlm.runtime.profile import decide

    if machine:
        if target is not None or set_ or shapes:
            raise CharlmError("--machine describes this machine, not a run or config; give it "
                              "alone (or with --json)")
        device = resolve_device("auto")
        profile = decide("auto", "auto", device)  # what `charlm train` would decide here
        if json_:
            print(json.dumps({"device": str(device), **dataclasses.asdict(profile)}, indent=2))
        else:
            print(profile.line(device).replace("recorded in config.yaml", "a run records these "
                                               "in its config.yaml"))
        return
    if vocab_size is not None and vocab_size < 1:
        raise CharlmError(f"--vocab-size must be >= 1, got {vocab_size}")
    if not shapes and (batch is not None or seq_len is not None):
        given = "--batch" if batch is not None else "--seq-len"
        raise CharlmError(f"{given} sizes the forward pass of --shapes; add --shapes")
    trained = is_model(target)
    if not trained:
        cfg, _ = train_config(target, list(set_ or []))
        model, train_state = config_model(cfg, vocab_size), None  # one block a stack, on meta
    else:
        if set_ or vocab_size is not None:
            given = "--set" if set_ else "--vocab-size"
            raise CharlmError(f"{given} applies to a config file, not to a checkpoint")
        lm = load(target, "cpu")
        model, cfg = lm.model, lm.config
        train_state = lm.train_state or None  # an export has no training progress to show
    size = (cfg.train.batch_size if batch is None else batch,
            cfg.model.block_size if seq_len is None else seq_len) if shapes else None
    run_dir = Path(cfg.train.out_dir) if trained else None  # its dataset cache, if still there
    report = describe(model, cfg, size, train_state, data_summary(cfg, run_dir))
    if json_:
        print(json.dumps(report, indent=2))
        return
    print(render_text(report))
    print("\nconfig:")
    print("  " + dump_yaml(report["config"]).replace("\n", "\n  ").rstrip())


def is_model(target: Path | None) -> bool:
    """Whether the argument names a trained model rather than what `charlm train` takes; a
    missing path that is no config is an error, so a mistyped run dir is not read as data."""
    from charlm.config.loading import is_config_file
    from charlm.core.files import missing
    from charlm.data.sources import GLOB_CHARS
    from charlm.export import is_export_dir

    # stdin and a quoted glob are text, as `charlm train` takes them
    if target is None or is_config_file(target) or str(target) == "-" or (
            not target.exists() and any(c in str(target) for c in GLOB_CHARS)):
        return False
    if target.suffix == ".pt":
        return True
    if not target.exists():
        raise missing(target, "run dir, checkpoint or text",
                      f"no such run dir, checkpoint, config or text: {target}")
    if target.is_dir():
        return is_export_dir(target) or any(
            (target / name).exists() for name in ("best.pt", "last.pt", "config.yaml"))
    return zipfile.is_zipfile(target)  # what torch.save writes
