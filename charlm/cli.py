"""The `charlm` command line: thin Typer commands that load config, call one library function
and print. Bad input ends as one `error: ...` line on stderr with exit code 2 (`--debug` shows
the traceback)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from charlm.config import DataConfig, SampleConfig
from charlm.errors import CharlmError

app = typer.Typer(
    name="charlm",
    help="Train character-level GPT language models on any text file, and sample from them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Options shared by several commands, defined once.
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", metavar="SECTION.KEY=VALUE",
                 help="Override one config key (value parsed as YAML); repeatable."),
]
DeviceOpt = Annotated[
    str, typer.Option(help="auto, cpu, cuda or mps.", metavar="DEVICE"),
]
TargetArg = Annotated[
    Path, typer.Argument(metavar="RUN_DIR_OR_CKPT",
                         help="A run dir (uses best.pt, else last.pt) or a .pt checkpoint."),
]


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    """charlm: prepare text, train a GPT on it, sample from the checkpoints."""


@app.command()
def prepare(
    inputs: Annotated[list[Path], typer.Argument(metavar="INPUT...", help="UTF-8 text files.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Dataset directory to write.")],
    val_fraction: Annotated[
        float, typer.Option(help="Last fraction of each input used for validation.")
    ] = DataConfig.val_fraction,
) -> None:
    """Encode text files into a dataset dir: meta.json, train.bin, val.bin."""
    from charlm.data import prepare as prepare_dataset

    meta = prepare_dataset(inputs, out, val_fraction)
    print(f"wrote {out}: {meta['vocab_size']} symbols ({meta['dtype']}), "
          f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val characters")


@app.command()
def train(
    config: Annotated[
        Path | None,
        typer.Argument(
            metavar="CONFIG_OR_TEXT",
            help="A YAML config (default: the built-in CPU recipe), or a text file / dataset "
            "dir to train the default recipe on (run dir runs/<name> unless --out).",
        ),
    ] = None,
    data: Annotated[
        str | None, typer.Option(help="Text file or prepared dataset dir (sets data.path).")
    ] = None,
    out: Annotated[str | None, typer.Option(help="Run dir (sets train.out_dir).")] = None,
    set_: SetOpt = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in the run dir from last.pt.")]
    = False,
    overwrite: Annotated[
        bool, typer.Option(help="Start over in a run dir that already holds a run.")
    ] = False,
) -> None:
    """Train a GPT (or resume a run) and write checkpoints, metrics and TensorBoard logs."""
    from charlm.config import load_config
    from charlm.train import resume_config
    from charlm.train import train as run_training

    if resume and overwrite:
        raise CharlmError("--resume and --overwrite exclude each other; choose one")
    overrides = list(set_ or [])
    if config is not None and config.suffix not in (".yaml", ".yml"):
        if data is not None:
            raise CharlmError(f"give the data either as {config} or as --data, not both")
        data, config = str(config), None
        if out is None:
            out = str(Path("runs") / Path(data).stem)
    if data is not None:
        overrides.append(f"data.path={json.dumps(data)}")
    if out is not None:
        overrides.append(f"train.out_dir={json.dumps(out)}")
    cfg = load_config(config, overrides)
    if resume:
        cfg = resume_config(Path(cfg.train.out_dir), config, overrides)
    state = run_training(cfg, resume=resume, overwrite=overwrite)
    print(f"done: {state.step} steps, best val loss {state.best_val:.4f}, "
          f"checkpoints in {cfg.train.out_dir}")


@app.command()
def sample(
    target: TargetArg,
    prompt: Annotated[str, typer.Option(help="Text to continue.")] = "\n",
    max_new_tokens: Annotated[int, typer.Option(help="Characters to generate per sample.")]
    = SampleConfig.max_new_tokens,
    num_samples: Annotated[int, typer.Option(help="Samples, generated as one batch.")]
    = SampleConfig.num_samples,
    temperature: Annotated[float, typer.Option(help="Softmax temperature; 0 is greedy.")]
    = SampleConfig.temperature,
    top_k: Annotated[int | None, typer.Option(help="Sample only from the k likeliest.")]
    = SampleConfig.top_k,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same text.")]
    = SampleConfig.seed,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Recompute the whole context every step.")
    ] = False,
    device: DeviceOpt = "auto",
) -> None:
    """Generate text from a checkpoint, streamed to stdout as it is produced."""
    import torch

    from charlm.checkpoint import load_model
    from charlm.device import resolve_device
    from charlm.generate import generate

    opts = SampleConfig(max_new_tokens, num_samples, temperature, top_k, seed, not no_cache)
    dev = resolve_device(device)
    model, vocab, _, _ = load_model(target, dev)
    if not prompt:
        raise CharlmError("--prompt is empty; give at least one character (default: newline)")
    unknown = vocab.unknown(prompt)
    if unknown:
        listed = ", ".join(f"{c!r} at position {i}" for i, c in unknown)
        raise CharlmError(f"prompt has characters outside the model's vocabulary: {listed}")
    ids = torch.tensor(vocab.encode(prompt), device=dev)
    batch = ids[None, :].repeat(opts.num_samples, 1)  # (K, T0)
    generator = torch.Generator(device=dev).manual_seed(opts.seed)
    out = sys.stdout
    rest: list[list[int]] = [[] for _ in range(opts.num_samples - 1)]
    out.write(prompt)
    out.flush()
    for step_ids in generate(model, batch, opts.max_new_tokens, opts.temperature, opts.top_k,
                             generator, opts.use_cache):
        row = step_ids.tolist()
        out.write(vocab.chars[row[0]])  # stream the first sample, buffer the others
        out.flush()
        for buf, i in zip(rest, row[1:], strict=True):
            buf.append(i)
    for buf in rest:
        out.write(f"\n{'-' * 40}\n{prompt}{vocab.decode(buf)}")
    out.write("\n")
    out.flush()


@app.command()
def info(
    target: Annotated[
        Path, typer.Argument(metavar="RUN_DIR_OR_CKPT_OR_CONFIG",
                             help="A run dir, a checkpoint or a YAML config.")
    ],
    set_: SetOpt = None,
    vocab_size: Annotated[
        int | None, typer.Option(help="Vocab size for a config (default: from its data).")
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
    """Parameter table per component, FLOPs per token, forward shapes and the resolved config."""
    from charlm.checkpoint import load_model
    from charlm.config import load_config
    from charlm.data import load_dataset, scan
    from charlm.model import GPT
    from charlm.summary import describe, render_text

    train_state = None
    if target.suffix in (".yaml", ".yml") and not target.is_dir():
        cfg = load_config(target, list(set_ or []))
        if vocab_size is None:
            data_path = Path(cfg.data.path)
            vocab_size = len(
                load_dataset(data_path).vocab if data_path.is_dir() else scan([data_path])[1]
            )
        model = GPT(cfg.model, vocab_size)
    else:
        if set_:
            raise CharlmError("--set applies to a config file, not to a checkpoint")
        model, _, cfg, state = load_model(target)
        train_state = state["train_state"]
    size = (batch or cfg.train.batch_size, seq_len or cfg.model.block_size) if shapes else None
    report = describe(model, cfg, size, train_state)
    if json_:
        print(json.dumps(report, indent=2))
        return
    print(render_text(report))
    print("\nconfig:")
    print("  " + yaml.safe_dump(report["config"], sort_keys=False).replace("\n", "\n  ").rstrip())


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning bad input into one `error:` line and exit code 2.

    Usage errors (unknown option, missing argument) are reported by Typer itself, also with
    exit code 2.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        app(args=argv, prog_name="charlm")
    except (CharlmError, OSError) as e:
        if "--debug" in argv:
            raise
        message = str(e) if isinstance(e, CharlmError) else f"{e.strerror or e}: {e.filename}"
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
