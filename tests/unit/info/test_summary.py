"""charlm.info.summary: `describe` gives plain data and strict JSON."""

import json

from charlm.config.schema import RunConfig
from charlm.info.summary import describe
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT
from tests.helpers import tiny_model_config

V = 11


def test_describe_is_plain_data():
    cfg = RunConfig(model=tiny_model_config())
    info = describe(GPT(cfg.model, V), cfg, shapes=(2, 5))
    assert set(info) == {"vocab_size", "parameters", "flops_per_token", "shapes", "config"}
    assert info["config"]["model"]["pos_encoding"] == "learned"
    assert info["shapes"][-1]["shape"] == [2, 5, V]


def test_a_checkpoint_not_yet_evaluated_has_no_best_val_loss_and_valid_json():
    """A run stopped before its first evaluation has best_val inf: `info --json` says null (JSON
    has no Infinity) and the text says so in words."""
    import math

    from charlm.info.summary import render_text

    cfg = RunConfig(model=tiny_model_config())
    state = {"step": 3, "best_val": math.inf, "tokens": 96}
    info = describe(GPT(cfg.model, V), cfg, train_state=state)
    assert info["checkpoint"] == {"step": 3, "best_val_loss": None, "tokens_seen": 96}
    json.dumps(info, allow_nan=False)  # strict JSON
    assert "best val loss: none yet\n" in render_text(info)
    state["best_val"] = 1.25
    info = describe(GPT(cfg.model, V), cfg, train_state=state)
    assert "best val loss: 1.2500\n" in render_text(info)


# The encoder-decoder (charlm.seq2seq): source and target vocabularies of VS and VT ids.
VS, VT = 9, 12


def test_describe_an_encoder_decoder_is_plain_data():
    cfg = RunConfig(model=tiny_model_config(arch="encoder_decoder"))
    info = describe(EncoderDecoder(cfg.model, VS, VT, VS - 1), cfg, shapes=(2, 5))
    assert set(info) == {"arch", "source_vocab_size", "target_vocab_size", "parameters",
                         "flops_per_token", "shapes", "config"}
    assert (info["source_vocab_size"], info["target_vocab_size"]) == (VS, VT)
    assert info["shapes"][-1] == {"stage": "head", "what": "logits", "shape": [2, 5, VT]}
    json.dumps(info, allow_nan=False)
