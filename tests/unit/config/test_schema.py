"""charlm.config.schema: a RunConfig survives to_dict and from_dict."""

from charlm.config.loading import load_config
from charlm.config.schema import ModelConfig, RunConfig


def test_round_trip_through_dict():
    cfg = load_config(None, ["model.n_layer=3"])
    assert RunConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig(n_ff=64).ff_width == 64
