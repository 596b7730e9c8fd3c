"""charlm.tune.space: search files and options, their errors, and spaces that could give an
invalid config."""

from __future__ import annotations

from pathlib import Path

import pytest

from charlm.config.loading import load_config
from charlm.core.errors import CharlmError
from charlm.tune.space import check_space, read_search
from tests.helpers import TINY, write


def search_of(tmp_path: Path, text: str) -> list[str]:
    return [str(write(tmp_path / "search.yaml", text))]


def test_search_file_and_options_give_params_and_settings(tmp_path: Path) -> None:
    items = search_of(tmp_path, "optim.lr: {type: float, low: 1e-4, high: 1e-2, log: true}\n"
                                "model.activation: [gelu, swiglu]\n"
                                "optim.min_lr: {of: optim.lr, times: 0.1}\n"
                                "trials: 7\nsampler: random\ntimeout: 5m\n")
    search = read_search([*items, "model.n_layer={type: int, low: 2, high: 6, step: 2}"])
    assert search.spec() == {
        "optim.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
        "model.activation": {"type": "categorical", "choices": ["gelu", "swiglu"]},
        "optim.min_lr": {"of": "optim.lr", "times": 0.1},
        "model.n_layer": {"type": "int", "low": 2, "high": 6, "step": 2},
    }
    assert search.settings == {"trials": 7, "sampler": "random", "timeout": 300.0}
    assert search.params["model.n_layer"].grid() == [2, 4, 6]
    base = load_config(TINY).to_dict()
    cfg = search.trial_config(base, {"optim.lr": 2e-3, "model.activation": "swiglu",
                                     "model.n_layer": 4})
    assert (cfg.optim.lr, cfg.optim.min_lr, cfg.model.activation, cfg.model.n_layer) == (
        2e-3, pytest.approx(2e-4), "swiglu", 4)


@pytest.mark.parametrize("text, message", [
    ("optim.lr: 0.01\n", "optim.lr in {f}: 0.01 is no distribution; give {{type: float"),
    ("optim.lr: {type: float, low: 1e-2, high: 1e-4}\n",
     "optim.lr in {f}: low 0.01 must be below high 0.0001"),
    ("optim.lr: {type: float, low: 0, high: 1, log: true}\n",
     "optim.lr in {f}: a log range needs low > 0, got 0"),
    ("optim.lr: {type: floats, low: 0, high: 1}\n",
     "optim.lr in {f}: type must be float, int or categorical, got 'floats'"),
    ("optim.lr: {type: float, low: 0, hihg: 1}\n",
     "optim.lr in {f}: unknown field 'hihg' for type float, did you mean 'high'?"),
    ("model.n_layer: {type: int, low: 1.5, high: 4}\n",
     "model.n_layer in {f}: low must be an integer, got 1.5"),
    ("model.activation: [gelu, gelu]\n",
     "model.activation in {f}: a choice is listed twice in ['gelu', 'gelu']"),
    ("trails: 5\n", "unknown setting 'trails' in {f}, did you mean 'trials'?"),
    ("sampler: cmaes\n", "sampler in {f}: 'cmaes' is not one of tpe, random, grid"),
    ("repeats: 0\n", "repeats in {f}: 0 must be an integer >= 1"),
    ("data.path: [a.txt, b.txt]\n", "data.path cannot be searched: a study trains every trial "
                                    "on the same data"),
])
def test_bad_search_files_are_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    items = search_of(tmp_path, text)
    with pytest.raises(CharlmError) as e:
        read_search(items)
    assert str(e.value).startswith(message.format(f=items[0]))


def test_a_space_that_can_give_an_invalid_config_is_refused_up_front(tmp_path: Path) -> None:
    base = load_config(TINY).to_dict()  # optim.min_lr: 1e-3
    search = read_search(["optim.lr={type: float, low: 1e-4, high: 1e-2, log: true}"])
    with pytest.raises(CharlmError) as e:
        check_space(search, base, "the search")
    assert str(e.value) == (
        "the search space can give an invalid config: with optim.lr=0.0001: invalid config "
        "value optim.min_lr: 0.001 must be in [0, lr], and lr is 0.0001; set optim.min_lr to "
        "at most lr, e.g. lr / 10 = 1e-05; search optim.min_lr with it (e.g. `optim.min_lr: "
        "{of: optim.lr, times: 0.1}` derives it from each trial's optim.lr), or fix it with "
        "--set")
    check_space(read_search(["optim.lr={type: float, low: 1e-4, high: 1e-2, log: true}",
                             "optim.min_lr={of: optim.lr, times: 0.1}"]), base, "the search")
    # two searched keys that only fail together: every combination of their ends is checked
    both = read_search(["model.n_embd=[32, 48]", "model.n_head=[2, 32]"])
    with pytest.raises(CharlmError, match=r"with model.n_embd=48, model.n_head=32: invalid "
                                          r"config value model.n_embd: 48 is not divisible"):
        check_space(both, base, "the search")
    with pytest.raises(CharlmError, match=r"unknown key 'model.n_layers', did you mean "
                                          r"'n_layer'\?"):
        check_space(read_search(["model.n_layers=[1, 2]"]), base, "the search")


def test_the_grid_of_each_kind_of_param(tmp_path: Path) -> None:
    search = read_search(["model.activation=[gelu, swiglu]",
                          "model.n_layer={type: int, low: 2, high: 5}",
                          "model.n_embd={type: int, low: 32, high: 128, step: 32}",
                          "optim.lr={type: float, low: 0.001, high: 0.003, step: 0.001}"])
    params = search.params
    assert params["model.activation"].grid() == ["gelu", "swiglu"]
    assert params["model.n_layer"].grid() == [2, 3, 4, 5]
    assert params["model.n_embd"].grid() == [32, 64, 96, 128]
    assert params["optim.lr"].grid() == pytest.approx([0.001, 0.002, 0.003])
    for spec in ("optim.lr={type: float, low: 0.001, high: 0.003}",
                 "model.n_layer={type: int, low: 2, high: 32, log: true}"):
        (param,) = read_search([spec]).params.values()
        with pytest.raises(CharlmError, match=f"^sampler grid needs a step for {param.key} "):
            param.grid()


def test_derived_values_follow_their_source_and_round_for_an_integer_field() -> None:
    base = load_config(TINY).to_dict()  # optim.lr: 0.01, model.n_layer: 2
    search = read_search(["model.n_layer=[2, 3]", "model.n_head={of: model.n_layer, times: 1.4}",
                          "optim.min_lr={of: optim.lr, times: 0.1}"])
    assert search.values({"model.n_layer": 3}, base) == {
        "model.n_layer": 3, "model.n_head": 4, "optim.min_lr": pytest.approx(0.001)}
    assert [p.key for p in search.sampled()] == ["model.n_layer"]
    with pytest.raises(CharlmError) as e:
        read_search(["optim.lr=[0.01, 0.02]", "optim.min_lr={of: optim.lr, times: 0.1}",
                     "optim.weight_decay={of: optim.min_lr, times: 2}"])
    assert str(e.value) == ("optim.weight_decay is derived from optim.min_lr, which is derived "
                            "itself; derive it from a searched or fixed key")


@pytest.mark.parametrize("items, message", [
    (["optim.lr=[0.01, 0.02]", "optim.lr=[0.03]"],
     "optim.lr is given twice in the search (--search); give it once"),
    (["train.out_dir=[a, b]"], "train.out_dir cannot be searched: a study trains every trial on "
     "the same data, each in its own run dir under --out (give data with --data)"),
    (["optim.lr"], "--search 'optim.lr' is neither a search file nor KEY=SPEC (e.g. --search "
     "'optim.lr={type: float, low: 1e-4, high: 1e-2}')"),
    (["optim.lr={type: float, low: 1, high: 2, log: true, step: 0.5}"],
     "optim.lr in --search: give log or step, not both (Optuna samples either)"),
])
def test_bad_search_options_are_one_clear_error(items: list[str], message: str) -> None:
    with pytest.raises(CharlmError) as e:
        read_search(items)
    assert str(e.value) == message


def test_a_study_may_choose_the_optimizer_and_muons_keys(tmp_path: Path) -> None:
    """optim.name and Muon's keys are config keys like the others: a trial's config gets the
    sampled optimizer, and a range past Muon's limits is refused up front."""
    items = search_of(tmp_path, "optim.name: [adamw, muon]\n"
                                "optim.muon_lr: {type: float, low: 0.005, high: 0.05, log: true}\n"
                                "optim.muon_momentum: {type: float, low: 0.85, high: 0.95}\n")
    search = read_search(items)
    base = load_config(TINY).to_dict()
    check_space(search, base, "the search")
    cfg = search.trial_config(base, {"optim.name": "muon", "optim.muon_lr": 0.01,
                                     "optim.muon_momentum": 0.9})
    assert (cfg.optim.name, cfg.optim.muon_lr, cfg.optim.muon_momentum) == ("muon", 0.01, 0.9)
    with pytest.raises(CharlmError) as e:
        check_space(read_search(["optim.muon_momentum={type: float, low: 0.9, high: 1.0}"]),
                    base, "the search")
    assert str(e.value) == ("the search space can give an invalid config: with "
                            "optim.muon_momentum=1.0: invalid config value optim.muon_momentum: "
                            "1.0 is outside [0, 1)")
