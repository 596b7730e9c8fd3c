"""charlm.training.metrics: config keys flattened for TensorBoard's hparams."""

from charlm.training.metrics import flatten


def test_flatten_names_keys_by_section():
    assert flatten({"model": {"n_layer": 2, "bias": False}, "train": {"every": None,
                                                                      "seq": (1, 2)}}) == {
        "model.n_layer": 2, "model.bias": False, "train.every": "None", "train.seq": "(1, 2)"}
