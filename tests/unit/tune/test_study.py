"""charlm.tune.study: the grid sampler and the pruner's warm-up."""

from __future__ import annotations

import pytest

from charlm.config.loading import load_config
from charlm.tune.space import read_search
from tests.helpers import TINY

optuna = pytest.importorskip("optuna")


def test_the_grid_sampler_ends_the_grid_without_raising() -> None:
    """Optuna's GridSampler calls Study.stop after the last point, which raises outside
    Study.optimize: the last trial of a grid was never recorded."""
    from charlm.tune.study import make_sampler

    search = read_search(["optim.lr=[0.002, 0.01]"])
    study = optuna.create_study(sampler=make_sampler(search, 0, 1))
    for _ in range(2):
        trial = study.ask()
        study.tell(trial, search.params["optim.lr"].suggest(trial))
    assert sorted(t.params["optim.lr"] for t in study.get_trials()) == [0.002, 0.01]
    assert all(t.state.name == "COMPLETE" for t in study.get_trials())


def test_the_pruner_judges_from_half_the_steps_unless_told() -> None:
    from charlm.tune.study import make_pruner

    base = load_config(TINY, ["train.max_iters=600"]).to_dict()
    assert make_pruner(read_search(["optim.lr=[0.002, 0.01]"]), base)._n_warmup_steps == 300
    told = read_search(["optim.lr=[0.002, 0.01]", "pruner_warmup=40"])
    assert make_pruner(told, base)._n_warmup_steps == 40
