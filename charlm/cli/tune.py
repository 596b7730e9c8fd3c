"""`charlm tune`: a new study (or the one in --out, resumed), run to its end."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from charlm.cli.options import is_default
from charlm.core.errors import CharlmError

Opt = typer.Option


def tune(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Argument(metavar="CONFIG_OR_TEXT", help="The base config (YAML), or "
                                    "a text file / dataset dir to tune the defaults on.")
    ] = None,
    search: Annotated[
        list[str] | None, Opt("--search", metavar="FILE|KEY=SPEC", help="A search file, or one "
                              "key and its distribution, e.g. 'optim.lr={type: float, low: 1e-4, "
                              "high: 1e-2, log: true}'; repeatable.")
    ] = None,
    out: Annotated[Path, Opt("--out", "-o", help="The study's directory.")] = Path("runs/tune"),
    trials: Annotated[int | None, Opt(help="Trials in the study, in all (default 20).")] = None,
    timeout: Annotated[
        str | None, Opt(metavar="DURATION", help="Start no trial after this long: 90, 30m, 2h.")
    ] = None,
    data: Annotated[str | None, Opt(help="Text file or dataset dir for every trial.")] = None,
    set_: Annotated[
        list[str] | None, Opt("--set", "-s", metavar="SECTION.KEY=VALUE",
                              help="Override a config key of every trial; repeatable.")
    ] = None,
    objective: Annotated[
        str | None, Opt(help="best_val_loss (default), final_val_loss; pairs: val_exact_match, "
                        "val_cer.")
    ] = None,
    sampler: Annotated[str | None, Opt(help="tpe (default), random or grid.")] = None,
    pruner: Annotated[
        str | None, Opt(help="median (default), halving, hyperband or none.")
    ] = None,
    pruner_warmup: Annotated[
        int | None, Opt(metavar="STEPS", help="Steps before a trial may be pruned (default: "
                        "half of train.max_iters).")
    ] = None,
    seed: Annotated[int | None, Opt(help="Seed of the sampler.")] = None,
    repeats: Annotated[
        int | None, Opt(metavar="N", help="Train each trial N times, with train.seed, seed + 1, "
                        "...; its value is their mean (less noise, N times the compute).")
    ] = None,
    storage: Annotated[
        str | None, Opt(metavar="URL", help="A database for the study (postgresql://...), "
                        "shared by workers on many machines; default: a journal file in --out.")
    ] = None,
    study: Annotated[
        str | None, Opt(help="The study's name in --storage (joined if it exists).")
    ] = None,
    workers: Annotated[int, Opt(help="Trials run at a time on this machine (one per GPU).")] = 1,
    resume: Annotated[bool, Opt(help="Continue the study in --out.")] = False,
) -> None:
    """Search a config's hyperparameters with Optuna: each trial is a `charlm train` in its own
    run dir under --out, pruned when it falls behind; the best config goes to OUT/best.yaml."""
    try:
        import optuna  # noqa: F401 - an optional extra
    except ImportError:
        raise CharlmError("charlm tune needs Optuna: pip install 'charlm[tune]'") from None
    from charlm.cli.train import train_config
    from charlm.tune.report import summarize
    from charlm.tune.runner import Tuner
    from charlm.tune.space import check_setting, read_search
    from charlm.tune.study import RESUMABLE, StudyConfig, new_study

    if workers < 1:
        raise CharlmError(f"--workers must be >= 1, got {workers}")
    if resume:  # the study in --out as it was made: only RESUMABLE options change it
        given = [p.opts[0] for p in ctx.command.params if p.name not in (
            "out", "trials", "timeout", "workers", "resume") and not is_default(ctx, p.name)]
        if given:
            raise CharlmError(f"--resume continues the study as it was made; {given[0]} cannot "
                              f"change it (only {', '.join(RESUMABLE)} can)")
        study_cfg = StudyConfig.load(out)
    else:  # options win over the search file's settings; the base config as `charlm train` reads it
        if not search:
            raise CharlmError("give the search space with --search FILE or --search KEY=SPEC")
        found = read_search(search)
        settings = {"objective": objective, "sampler": sampler, "pruner": pruner,
                    "pruner_warmup": pruner_warmup, "seed": seed, "repeats": repeats,
                    "trials": trials, "timeout": timeout}
        found.settings.update({k: check_setting(k, v, "the options")
                               for k, v in settings.items() if v is not None})
        cfg, _ = train_config(config, set_ or [], data=data, out=str(out / "base"))
        study_cfg = new_study(cfg, found, out, storage, study)
    space = study_cfg.search
    limit = space.setting("timeout") if timeout is None else check_setting(
        "timeout", timeout, "--timeout")
    if trials is None:  # the search's; a grid without either: every combination
        grid = space.setting("sampler") == "grid" and "trials" not in space.settings
        trials = (math.prod(len(p.grid()) for p in space.sampled()) if grid
                  else space.setting("trials"))
    tuner = Tuner(study_cfg, workers, check_setting("trials", trials, "--trials"), limit)
    code = summarize(tuner, tuner.run())
    if code:
        raise typer.Exit(code)
