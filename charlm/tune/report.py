"""What `charlm tune` shows and leaves behind: a line per finished trial, the table of trials
(also OUT/trials.txt), OUT/best.yaml (the best trial's config, for `charlm train`), the plots."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path
from typing import Any

from charlm.config.loading import save_config
from charlm.core.durations import format_duration
from charlm.tune.trial import Outcome

PLOTS = {  # file in OUT -> optuna.visualization.matplotlib function
    "history.png": "plot_optimization_history",
    "intermediate.png": "plot_intermediate_values",
    "importance.png": "plot_param_importances",
}


def shown_params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in params.items())


def trial_line(number: int, outcome: Outcome, params: dict[str, Any]) -> str:
    value = "" if outcome.value is None else f" {outcome.value:.4f}"
    step = "" if outcome.step is None else f" at step {outcome.step}"
    why = f" ({outcome.error})" if outcome.error and outcome.state != "complete" else ""
    return (f"trial {number} {outcome.state}{value}{step}, "
            f"{format_duration(outcome.seconds)}: {shown_params(params)}{why}")


STATES = {  # Optuna's state of a trial the tuner did not finish -> the table's word
    "COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "still running",
    "WAITING": "queued",
}


def state_word(trial: Any) -> str:
    """How a trial ended, as its tuner recorded it; else (a killed tuner's trial, one another
    worker still runs, one queued) a word for Optuna's state."""
    if "state" in trial.user_attrs:
        return trial.user_attrs["state"]
    return "interrupted" if trial.user_attrs.get("interrupted") else STATES[trial.state.name]


def sort_key(trial: Any, maximize: bool) -> tuple[int, float]:
    """Complete trials by value, then pruned ones by the value they had, then the rest."""
    rank = {"COMPLETE": 0, "PRUNED": 1}.get(trial.state.name, 2)
    value = trial.value if trial.value is not None else (
        trial.intermediate_values[trial.last_step] if trial.last_step is not None else None)
    if value is None or not math.isfinite(value):
        return rank, math.inf
    return rank, -value if maximize else value


def table(study: Any) -> str:
    """The study's trials, a row each, sorted by the objective (`sort_key`)."""
    maximize = study.direction.name == "MAXIMIZE"
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: sort_key(t, maximize))
    rows = [("trial", "state", "value", "step", "time", "values")]
    for t in trials:
        state = state_word(t)
        _, value = sort_key(t, maximize)
        value = "" if not math.isfinite(value) else f"{abs(value):.4f}"
        seconds = t.user_attrs.get("seconds")
        rows.append((str(t.number), state, value, str(t.user_attrs.get("step", "")),
                     "" if seconds is None else format_duration(seconds),
                     shown_params(t.params) + (f"  {t.user_attrs['error']}"
                                               if t.user_attrs.get("error") else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True))
                     + "  " + r[5] for r in rows)


def write_best(study_cfg: Any, trial: Any) -> Path:
    """OUT/best.yaml: the best trial's config on the user's data, run dir OUT/best."""
    base = study_cfg.trial_base(study_cfg.out / "best")
    base["data"]["path"] = study_cfg.base["data"]["path"]  # as the user gave it
    path = study_cfg.out / "best.yaml"
    save_config(study_cfg.search.trial_config(base, trial.params, "the best trial's config"), path)
    return path


def write_plots(study: Any, out: Path) -> list[str]:
    """The files of PLOTS written: a plot the study cannot give yet (one trial) is left out."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as plots
    except ImportError:
        return []
    written = []
    for name, function in PLOTS.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ax = getattr(plots, function)(study)
                ax.figure.savefig(out / name, dpi=100, bbox_inches="tight")
            written.append(name)
        except Exception:  # too few trials for it, or nothing that varies
            pass
        finally:
            plt.close("all")
    return written


def summarize(tuner: Any, signum: int | None) -> int:
    """Print the table, write trials.txt, best.yaml and the plots; the exit code: 0, 128 + the
    signal that stopped the study (as `charlm train`), 1 when no trial completed."""
    study_cfg, study, out = tuner.study_cfg, tuner.study, tuner.study_cfg.out
    text = table(study)
    (out / "trials.txt").write_text(text + "\n", encoding="utf-8")
    print(text)
    try:
        best = study.best_trial
    except ValueError:  # no trial completed
        best = None
    plots = write_plots(study, out)
    if best is not None:
        path = write_best(study_cfg, best)
        print(f"best: trial {best.number}, {study_cfg.search.setting('objective')} "
              f"{best.value:.4f}: {shown_params(best.params)}\nwrote {path}"
              + (f", {', '.join(plots)}" if plots else "") + f" in {out}; train it with "
              f"`charlm train {path}`")
    if signum is not None:
        print(f"stopped: the study is saved; continue it with `charlm tune --out {out} "
              "--resume`", file=sys.stderr)
        return 128 + signum
    if best is None:
        print("no trial completed: see the errors in the table above", file=sys.stderr)
        return 1
    return 0
