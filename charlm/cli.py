"""The `charlm` command line: thin Typer commands that load config, call one library function
and print. Bad input ends as one `error: ...` line on stderr with exit code 2 (`--debug` shows
the traceback)."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

try:  # typer vendors click since 0.2x
    from typer._click.exceptions import ClickException
except ImportError:  # an older typer, on click
    from click.exceptions import ClickException

from charlm.config import DataConfig, RunConfig
from charlm.errors import (
    CharlmError,
    Interrupt,
    characters,
    out_of_memory,
    out_of_memory_line,
    raise_interrupt,
    report,
    tolerant_stdout,
)
from charlm.sample_config import SampleConfig, with_sample_options

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
        float, typer.Option(help="Last fraction of each input used for validation (pairs: the "
                            "share of sources, by a hash of each).")
    ] = DataConfig.val_fraction,
    pairs: Annotated[
        bool, typer.Option("--pairs", help="The inputs hold source<TAB>target lines (for "
                           "model.arch=encoder_decoder); --set data.KEY=VALUE sets separator, "
                           "target_units, test_fraction, max_*_len, skip_bad_pairs.")
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Encode text files into a dataset dir: meta.json, train.bin, val.bin (pairs: one .npz
    per split)."""
    if pairs:
        from charlm.config import load_config
        from charlm.pairs import prepare_pairs

        cfg = load_config(None, [("data.format", "pairs"), ("data.val_fraction", val_fraction),
                                 *(set_ or [])])
        meta = prepare_pairs(inputs, out, cfg.data, cfg.model.block_size)
        counts = " / ".join(f"{n:,} {split}" for split, n in meta["pairs"].items())
        print(f"wrote {out}: {counts} pairs" + (f", {meta['skipped']:,} bad lines skipped"
                                                if meta["skipped"] else ""))
        return
    if set_:
        raise CharlmError("--set applies to --pairs only; text takes --val-fraction")
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
            help="A YAML config (default: the built-in defaults, a small GPT-2), or a text file "
            "/ dataset dir to train the defaults on (run dir runs/<name> unless --out).",
        ),
    ] = None,
    data: Annotated[
        str | None, typer.Option(help="Text file or prepared dataset dir (sets data.path; "
                                 "without a CONFIG, the run dir is runs/<name> unless --out).")
    ] = None,
    out: Annotated[str | None, typer.Option(help="Run dir (sets train.out_dir).")] = None,
    device: Annotated[
        str | None, typer.Option(metavar="DEVICE", help=f"{DEVICES} (sets train.device).")
    ] = None,
    budget: Annotated[
        str | None, typer.Option("--time", metavar="DURATION", help="Time budget: 90, 30s, 5m, "
                                 "2h (sets train.max_time); the steps are chosen to fit it.")
    ] = None,
    set_: SetOpt = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in the run dir from last.pt.")]
    = False,
    overwrite: Annotated[
        bool, typer.Option(help="Start over in a run dir that already holds a run.")
    ] = False,
) -> None:
    """Train a GPT (or resume a run) and write checkpoints, metrics and TensorBoard logs."""
    # torch only after the config is checked: a mistyped key or path is reported at once
    from charlm.config import train_config

    if resume and overwrite:
        raise CharlmError("--resume and --overwrite exclude each other; choose one")
    cfg = train_config(config, set_ or [], data=data, out=out, device=device, budget=budget,
                       resume=_resume_config if resume else None)
    from charlm.device import is_main_process
    from charlm.faults import Interrupted
    from charlm.train import train as run_training

    main_rank = is_main_process()  # under torchrun, rank 0 alone speaks for the run
    try:
        state = run_training(cfg, resume=resume, overwrite=overwrite)
    except Interrupted as e:  # last.pt is saved; say where, exit 130 / 143
        if main_rank:
            print(e, file=sys.stderr)
        raise typer.Exit(e.exit_code) from None
    if main_rank:
        best = f"{state.best_val:.4f}" if math.isfinite(state.best_val) else "none (no finite eval)"
        print(f"done: {state.step} steps, best val loss {best}, checkpoints in {cfg.train.out_dir}")


def _resume_config(*args: object) -> RunConfig:
    from charlm.rundir import resume_config  # imports torch: only once the run dir is known

    return resume_config(*args)


def _default(ctx: typer.Context, option: str) -> bool:
    """Whether the command's `option` was left at its default (by the source's name: typer
    may bring its own copy of click)."""
    source = ctx.get_parameter_source(option)
    return source is None or source.name == "DEFAULT"


@app.command()
@with_sample_options
def sample(
    ctx: typer.Context,
    target: TargetArg,
    prompt: Annotated[
        str | None, typer.Option(help="Text to continue; '-' reads it from stdin. [default: a "
                                 "newline, or the first character of a vocabulary without one]",
                                 show_default=False),
    ] = None,
    prompt_file: Annotated[
        Path | None, typer.Option(help="Read the prompt from this UTF-8 file.")
    ] = None,
    source: Annotated[
        str | None, typer.Option(help="Encoder-decoder: the text to transduce; '-' reads one "
                                 "source per line from stdin.")
    ] = None,
    source_file: Annotated[
        Path | None, typer.Option(help="Encoder-decoder: one source per line of this file; one "
                                  "output line each.")
    ] = None,
    stream: Annotated[bool, typer.Option(help="Print characters as they are generated.")] = True,
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object per sample: text, prompt, tokens, "
                           "seconds, stopped.")
    ] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    **options: object,
) -> None:
    """Generate text from a checkpoint, streamed to stdout as it is produced."""
    from charlm.api import load
    from charlm.sampling import default_prompt, encode_prompt, print_samples, read_prompt

    opts = SampleConfig(**options)
    sources_given = source is not None or source_file is not None
    text = None if sources_given else read_prompt(prompt, prompt_file)
    lm = load(target, device, "--device", dtype)
    if lm.config.model.arch == "encoder_decoder" or sources_given:
        from charlm.translation import print_translations, read_sources

        if prompt is not None or prompt_file is not None:
            raise CharlmError("--prompt is for a GPT; an encoder-decoder takes --source or "
                              "--source-file")
        sources = read_sources(source, source_file, lm.config.model.arch)
        if opts.compile:
            print("warning: --compile compiles a GPT's decode step; an encoder-decoder decodes "
                  "eagerly", file=sys.stderr)
        if _default(ctx, "temperature"):  # a transduction's likeliest output, unless asked
            opts = dataclasses.replace(opts, temperature=0.0)
        print_translations(lm.model, lm.vocab, sources, opts, json_out)
        return
    if text is None:
        text = default_prompt(lm.vocab)
    text, _, warnings = encode_prompt(lm.vocab, text, opts.unknown, lm.model.cfg.block_size)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print_samples(lm.model, lm.vocab, text, opts, stream, json_out)


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
    from charlm.checkpoint import load_model
    from charlm.config import dump_yaml, is_config_file, load_config
    from charlm.export import is_export_dir, load_safetensors
    from charlm.summary import config_model, describe, render_text

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


@app.command("eval")
def eval_(
    target: TargetArg,
    text_file: Annotated[
        Path, typer.Argument(metavar="TEXT_FILE", help="UTF-8 text file to score (pairs for an "
                             "encoder-decoder).")
    ],
    stride: Annotated[
        int | None, typer.Option(help="Every scored character after the first window sees at "
                                 "least this many characters of context; windows advance by "
                                 "block_size - stride. "
                                 "[default: block_size // 2]", show_default=False),
    ] = None,
    unknown: Annotated[
        str, typer.Option(help="Characters outside the vocabulary: error or skip.")
    ] = "error",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    beams: Annotated[
        int | None, typer.Option(help="Encoder-decoder: decode with beam search of N beams "
                                 "(default: greedy).")
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
) -> None:
    """Score a text file: loss in nats/char, bits per char, perplexity (a full, deterministic
    pass in overlapping windows). For an encoder-decoder, a file of source<TAB>target pairs:
    exact match, WER, CER (PER for space units) and loss."""
    from charlm.api import load
    from charlm.data import read_text
    from charlm.scoring import score_text

    lm = load(target, device, "--device", dtype)
    if lm.config.model.arch == "encoder_decoder":
        from charlm.translation import eval_pairs_file

        eval_pairs_file(lm, text_file, unknown, json_out, beams)
        return
    if beams is not None:
        raise CharlmError("--beams applies to an encoder-decoder's eval; a GPT's eval scores "
                          "the text as it is")
    result = score_text(lm.model, lm.vocab, read_text(text_file), stride, unknown)
    for note in result.notes():
        print(f"warning: {note}", file=sys.stderr)
    if json_out:
        print(json.dumps(result.as_dict(), allow_nan=False))
        return
    print(f"loss {result.loss:.4f} nats/char, {result.bpc:.4f} bits/char, perplexity "
          f"{result.perplexity:.3f}, {characters(result.chars_scored)} scored")


@app.command()
def export(
    target: TargetArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write.")],
    format_: Annotated[
        str, typer.Option("--format", help="safetensors (charlm, pickle-free) or hf "
                          "(transformers GPT-2 + tokenizer).")
    ] = "safetensors",
    overwrite: Annotated[
        bool, typer.Option(help="Replace the contents of a non-empty --out directory.")
    ] = False,
) -> None:
    """Export a model as safetensors, or as a Hugging Face GPT-2 directory."""
    from charlm.api import load
    from charlm.export import FORMATS, export_model

    if format_ not in FORMATS:
        raise CharlmError(f"--format must be {' or '.join(FORMATS)}, got {format_!r}")
    lm = load(target, "cpu")
    export_model(lm.model, lm.vocab, lm.config, lm.source, out, format_, overwrite)
    print(f"wrote {out} ({format_})")


from charlm.cli_tune import tune  # noqa: E402 - registered after the shared options

app.command()(tune)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning bad input into one `error:` line and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    tolerant_stdout()
    # Typer turns KeyboardInterrupt into a silent exit 130; Ctrl-C raises past it instead.
    sigint = signal.getsignal(signal.SIGINT)
    if sigint is signal.default_int_handler:
        signal.signal(signal.SIGINT, raise_interrupt)
    try:
        code = app(args=argv, prog_name="charlm", standalone_mode=False)
    except ClickException as e:  # a usage error (an unknown option, ...); `charlm` alone: help
        where = e.ctx.command_path if getattr(e, "ctx", None) else "charlm"
        if argv:
            report(f"error: {e.format_message()} (see `{where} -h`)")
        else:
            e.show()
        sys.exit(e.exit_code)
    except (CharlmError, OSError) as e:
        if "--debug" in argv:
            raise
        message = str(e) if isinstance(e, CharlmError) else (
            f"{e.strerror or e}: {e.filename}" if e.filename else f"{e.strerror or e}")
        report(f"error: {message}")
        sys.exit(2)
    except RuntimeError as e:  # torch.OutOfMemoryError (CUDA) is one too
        if "--debug" in argv or not out_of_memory(e):
            raise
        # every process prints it: under torchrun one GPU may run out alone
        command = next((a for a in argv if not a.startswith("-")), "train")
        print(out_of_memory_line(e, command), file=sys.stderr)
        sys.exit(2)
    except Interrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
    finally:
        if sigint is signal.default_int_handler:
            signal.signal(signal.SIGINT, sigint)
    sys.exit(code or 0)  # as typer's own main ends; code: typer.Exit's (130, 143 if interrupted)
