"""`charlm train`: what its arguments and options resolve to (`train_config`), and the run."""

from __future__ import annotations

import math
import sys
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from charlm.cli.options import DEVICES, SetOpt
from charlm.config.loading import Override, dotted_key, is_config_file, load_config
from charlm.config.schema import RunConfig
from charlm.config.yaml_files import read_yaml_file
from charlm.core.durations import format_duration
from charlm.core.errors import CharlmError
from charlm.core.ranks import is_main_process

if TYPE_CHECKING:
    from charlm.training.parent import Parent


def train(
    config: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="CONFIG_OR_TEXT...",
            help="A YAML config (default: the built-in defaults, a small GPT-2), or the text to "
            "train the defaults on: files, folders, quoted globs ('src/**/*.py'), .gz/.bz2/.xz "
            "files, - for stdin, or a dataset dir (run dir runs/<name> unless --out).",
        ),
    ] = None,
    data: Annotated[
        list[str] | None, typer.Option(help="The text, as CONFIG_OR_TEXT takes it; repeatable "
                                       "(sets data.path; the run dir is runs/<name> unless "
                                       "--out or the config names one).")
    ] = None,
    skip_invalid: Annotated[
        bool, typer.Option("--skip-invalid", help="Skip (and count) input files that are empty "
                           "or not UTF-8 text (sets data.skip_invalid).")
    ] = False,
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
        bool, typer.Option(help="Start over in a run dir that already holds a run (only the "
                           "run's own files are removed).")
    ] = False,
    init_from: Annotated[
        str | None, typer.Option(metavar="RUN_OR_CKPT_OR_EXPORT", help="Fine-tune: start from "
                                 "this model's weights (sets train.init_from).")
    ] = None,
) -> None:
    """Train a GPT (or resume a run) and write checkpoints, metrics and TensorBoard logs."""
    # torch only after the config is checked: a mistyped key or path is reported at once
    if resume and overwrite:
        raise CharlmError("--resume and --overwrite exclude each other; choose one")
    if resume and init_from is not None:
        raise CharlmError("--init-from starts a new run from a model's weights, --resume "
                          "continues a run from its last.pt; give one of them")
    overrides = [*(set_ or []), *([("data.skip_invalid", True)] if skip_invalid else [])]
    cfg, parent = train_config(config, overrides, data=data, out=out, device=device,
                               budget=budget, init_from=init_from, resume=resume)
    size = None if resume else sized_keys(config, overrides, cfg)
    from charlm.training.faults import Aborted, Interrupted
    from charlm.training.loop import train as run_training

    main_rank = is_main_process()  # under torchrun, rank 0 alone speaks for the run
    try:
        state = run_training(cfg, resume=resume, overwrite=overwrite, parent=parent, size=size)
    except Interrupted as e:  # last.pt is saved; say where, exit 130 / 143
        if main_rank:
            print(e, file=sys.stderr)
        raise typer.Exit(e.exit_code) from None
    except Aborted as e:  # a second signal: the abort line is on stderr already
        raise typer.Exit(e.exit_code) from None
    if main_rank:
        best = f"{state.best_val:.4f}" if math.isfinite(state.best_val) else "none (no finite eval)"
        seconds = max(state.elapsed_s, 1e-9)  # all of the run's time, resumes and evals included
        print(f"done: {state.step} steps in {format_duration(state.elapsed_s)} "
              f"({state.step / seconds:.1f} steps/s, {state.tokens / seconds:,.0f} tok/s), "
              f"best val loss {best}, checkpoints in {cfg.train.out_dir}")


def fine_tune_config(cfg: RunConfig, given: set[str],
                     data_given: set[str] = frozenset()) -> tuple[RunConfig, Parent]:
    """A fine-tune's config (`cfg` with the architecture, units and normal form of the model
    train.init_from names, but for the model and data keys the user set) and that model."""
    from charlm.api import load  # imports torch: only for a fine-tune
    from charlm.data.chunks import sha256_file
    from charlm.export import WEIGHTS
    from charlm.training.parent import Parent, parent_config

    try:
        lm = load(cfg.train.init_from, device="cpu")
    except CharlmError as e:
        raise CharlmError(f"--init-from: {e}") from None
    weights = lm.source / WEIGHTS if lm.source.is_dir() else lm.source
    parent = Parent(str(lm.source), weights, sha256_file(weights), lm.config, lm.vocab,
                    lm.model.state_dict())
    return parent_config(cfg, given, parent, data_given), parent


def sized_keys(config: str | Path | typing.Sequence[str | Path] | None,
               overrides: typing.Sequence[Override], cfg: RunConfig) -> frozenset[str] | None:
    """The keys the user set, when `charlm train` sizes the GPT to the time budget (a fresh run
    of the built-in defaults with train.max_time and no --init-from); else None."""
    if (config_file(config)[0] is not None or cfg.train.max_time is None
            or cfg.train.init_from is not None):
        return None
    return frozenset(dotted_key(o) for o in overrides)


def config_file(config: str | Path | typing.Sequence[str | Path] | None
                ) -> tuple[Path | None, list[str | Path]]:
    """CONFIG_OR_TEXT... as (the YAML config, if the first is one; the rest, the data)."""
    args = [] if config is None else [config] if isinstance(config, (str, Path)) else list(config)
    return (Path(args.pop(0)) if args and is_config_file(Path(args[0])) else None), args


def keys_given(config: Path | None, overrides: typing.Sequence[Override],
               section: str = "model") -> set[str]:
    """The keys of `section` a config file and the overrides set, whatever their values."""
    raw = read_yaml_file(config) if config is not None else {}
    table = raw.get(section) if isinstance(raw, dict) else None
    keys = {str(k) for k in table} if isinstance(table, dict) else set()
    dotted = (dotted_key(o).partition(".") for o in overrides)
    return keys | {key for name, _, key in dotted if name == section}


def train_config(
    config: str | Path | typing.Sequence[str | Path] | None,
    overrides: typing.Sequence[Override] = (), *,
    data: str | typing.Sequence[str] | None = None, out: str | None = None,
    device: str | None = None,
    budget: str | None = None, init_from: str | None = None, resume: bool = False,
) -> tuple[RunConfig, Parent | None]:
    """The config `charlm train CONFIG_OR_TEXT... --data --out --device --time --set` runs (a
    resume's: the checkpoint's), and the model a fine-tune starts from (else None). A YAML
    config may come first; the other arguments are the data, as --data is."""
    overrides = list(overrides)
    config, args = config_file(config)
    data = [data] if isinstance(data, str) else list(data or [])
    data_given = "--data"
    if args:
        if data:
            raise CharlmError(f"give the data either as {args[0]} or as --data, not both")
        data, data_given = [str(a) for a in args], str(args[0])
    data = None if not data else data[0] if len(data) == 1 else data
    set_keys = {dotted_key(o) for o in overrides}
    options = [(given, key, value) for given, key, value in (
        (data_given, "data.path", data), ("--out", "train.out_dir", out),
        ("--device", "train.device", device), ("--time", "train.max_time", budget),
        ("--init-from", "train.init_from", init_from)) if value is not None]
    for given, key, _ in options:
        if key in set_keys:
            raise CharlmError(f"{given} and --set {key} set the same key; give one of them")
    if device is not None:
        from charlm.runtime.device import resolve_device  # imports torch: only when asked for

        resolve_device(device, "device")  # a missing device is an error naming --device
    overrides += [(key, value) for _, key, value in options]
    if resume:
        from charlm.training.resume import resume_config  # imports torch: only for a resume

        # Without a CONFIG the overrides apply to the checkpoint's config, not to the defaults
        # (`--set optim.min_lr=...` may be legal only with the run's optim.lr): here only the run
        # dir is needed, to find the checkpoint, and data.path names it when out_dir does not.
        run = load_config(config, overrides if config else
                          [o for o in overrides if dotted_key(o) in ("train.out_dir", "data.path")])
        return resume_config(Path(run.train.out_dir), config, overrides), None
    cfg = load_config(config, overrides)
    if data is None and "data.path" not in set_keys and not Path(cfg.data.inputs[0]).exists():
        raise CharlmError(  # data.path is not the user's own words: say where it came from
            f"input file not found: {cfg.data.shown} (data.path of "
            f"{config or 'the built-in defaults'}, taken from the current directory); "
            "give your text as `charlm train my.txt` or --data PATH"
        )
    if cfg.train.init_from is None:
        return cfg, None
    return fine_tune_config(cfg, keys_given(config, overrides),
                            keys_given(config, overrides, "data"))
