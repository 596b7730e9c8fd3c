"""charlm.config.schema: a RunConfig survives to_dict and from_dict; the optimizer's keys are
checked."""

import pytest

from charlm.config.loading import load_config
from charlm.config.schema import ModelConfig, RunConfig
from charlm.core.errors import CharlmError


def test_round_trip_through_dict():
    cfg = load_config(None, ["model.n_layer=3"])
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig(n_ff=64).ff_width == 64


@pytest.mark.parametrize("override, message", [
    ("optim.name=sgd", "invalid value for optim.name in --set overrides: 'sgd', expected one of "
                       "'adamw', 'muon'"),
    ("optim.muon_lr=0", "invalid config value optim.muon_lr: 0.0 must be > 0"),
    ("optim.muon_momentum=1", "invalid config value optim.muon_momentum: 1.0 is outside [0, 1)"),
    ("optim.muon_momentum=-0.1", "invalid config value optim.muon_momentum: -0.1 is outside "
                                 "[0, 1)"),
    ("optim.muon_weight_decay=-1", "invalid config value optim.muon_weight_decay: must be >= 0"),
])
def test_the_optimizers_keys_are_checked(override, message):
    with pytest.raises(CharlmError) as e:
        load_config(None, [override])
    assert str(e.value) == message


def test_muon_is_chosen_with_its_own_defaults():
    optim = load_config(None, ["optim.name=muon"]).optim
    assert (optim.name, optim.muon_lr, optim.muon_momentum, optim.muon_weight_decay) == (
        "muon", 0.02, 0.95, 0.0)
    assert load_config(None, []).optim.name == "adamw"
