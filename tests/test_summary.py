import dataclasses
import itertools

import pytest

from charlm.config import ModelConfig, RunConfig
from charlm.errors import CharlmError
from charlm.model import GPT
from charlm.summary import describe, flops_per_token, forward_shapes, parameter_table

from .test_model import V, expected_params, tiny


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_table_totals_match_the_formula_tied_and_untied(activation):
    for bias, tie, pos, norm, placement in itertools.product(
            [False, True], [False, True], ["learned", "sinusoidal", "rope", "none"],
            ["layernorm", "rmsnorm"], ["pre", "post"]):
        cfg = tiny(bias=bias, tie_weights=tie, activation=activation, pos_encoding=pos,
                   norm=norm, norm_placement=placement)
        table = parameter_table(GPT(cfg, V))
        tied = expected_params(dataclasses.replace(cfg, tie_weights=True), V)
        untied = expected_params(dataclasses.replace(cfg, tie_weights=False), V)
        assert table["total"] == (tied if tie else untied), cfg
        assert (table["total_tied"], table["total_untied"]) == (tied, untied), cfg
        assert table["all_layers"] == cfg.n_layer * table["per_layer"]
        deep = dataclasses.replace(cfg, n_layer=3)  # a one-layer model stands for it
        assert parameter_table(GPT(dataclasses.replace(cfg, n_layer=1), V), 3) == \
            parameter_table(GPT(deep, V)), cfg


def test_table_rows_for_the_default_model():
    table = parameter_table(GPT(tiny(), V))
    rows = {r["component"]: (r["shape"], r["params"]) for r in table["rows"]}
    assert rows["token embedding"] == ([V, 32], V * 32)
    assert rows["position embedding (learned)"] == ([16, 32], 16 * 32)
    for part in "qkvo":
        assert rows[f"attention {part} weight"] == ([32, 32], 1024)
        assert rows[f"attention {part} bias"] == (None, 0)
    assert rows["mlp up weight"] == ([128, 32], 4096)
    assert rows["mlp down weight"] == ([32, 128], 4096)
    assert rows["layernorm before attention weight"] == ([32], 32)
    assert rows["head (tied: the token embedding, no new parameters)"] == (None, 0)
    assert table["per_layer"] == 4 * 1024 + 2 * 4096 + 2 * 32


def test_table_rows_for_swiglu_rope_rmsnorm_postnorm_untied_bias():
    cfg = tiny(activation="swiglu", pos_encoding="rope", norm="rmsnorm", norm_placement="post",
               tie_weights=False, bias=True)
    rows = {r["component"]: (r["shape"], r["params"]) for r in parameter_table(GPT(cfg, V))["rows"]}
    assert rows["position encoding (rotary, applied to q and k)"] == (None, 0)
    assert rows["attention q bias"] == ([32], 32)
    assert rows["mlp gate weight"] == rows["mlp up weight"] == ([88, 32], 88 * 32)
    assert rows["mlp down weight"] == ([32, 88], 88 * 32)
    assert rows["rmsnorm after attention bias"] == (None, 0)  # RMSNorm has no bias
    assert rows["final norm (none: post-norm blocks end in a norm)"] == (None, 0)
    assert rows["head"] == ([V, 32], V * 32)


def test_flops_per_token_palm_style_for_the_baby_gpt():
    cfg = ModelConfig(block_size=256, n_layer=6, n_head=6, n_embd=384)
    flops = flops_per_token(parameter_table(GPT(cfg, 65)), cfg, 65)
    n = 10_745_088 - 256 * 384  # all but the position table; the tied head is the wte matrix
    assert flops["N"] == n
    assert flops["training"] == 6 * n + 12 * 6 * 384 * 256
    assert flops["decode_step"] == 2 * n + 4 * 6 * 384 * 256
    # N counts the head's matmul once whether it is tied, and no embedding lookup
    for other in (dataclasses.replace(cfg, tie_weights=False),
                  dataclasses.replace(cfg, pos_encoding="rope")):
        assert flops_per_token(parameter_table(GPT(other, 65)), other, 65)["N"] == n


def stage_shapes(stages):
    return {s["stage"].strip(): s["shape"] for s in stages}


def test_forward_shapes_follow_one_forward_pass():
    cfg = tiny(activation="swiglu", pos_encoding="rope")
    stages = forward_shapes(cfg, V, batch=3, seq_len=10)
    shapes = stage_shapes(stages)
    assert stages[0]["stage"] == "idx" and shapes["idx"] == [3, 10]
    assert shapes["wte"] == [3, 10, 32] and "wpe" not in shapes
    assert shapes["q, k, v"] == shapes["rope"] == [3, 2, 10, 16]
    assert shapes["softmax(q k^T / sqrt(D))"] == [3, 2, 10, 10]
    assert shapes["blocks.0.mlp.fc"] == [3, 10, 176]  # gate and up of width 88
    assert shapes["silu(gate) * up"] == [3, 10, 88]
    assert shapes["blocks.1"] == [3, 10, 32]
    assert stages[-1] == {"stage": "head", "what": "logits", "shape": [3, 10, V]}


def test_forward_shapes_of_sinusoidal_positions():
    shapes = stage_shapes(forward_shapes(tiny(pos_encoding="sinusoidal"), V, 2, 7))
    assert shapes["wte"] == [2, 7, 32] and shapes["sinusoid table"] == [7, 32]
    assert "wpe" not in shapes and "rope" not in shapes


def test_forward_shapes_show_post_norm_order():
    names = [s["stage"] for s in forward_shapes(tiny(norm_placement="post"), V, 1, 4)]
    assert names.index("blocks.0.attn.proj") < names.index("blocks.0.ln_1")
    assert names.index("blocks.0.mlp.proj") < names.index("blocks.0.ln_2")
    assert "ln_f" not in names and "wpe" in names


def test_forward_shapes_refuse_a_sequence_longer_than_the_block():
    with pytest.raises(CharlmError, match=r"--seq-len 17 must be in 1..block_size \(16\)"):
        forward_shapes(tiny(), V, 1, 17)


def test_describe_is_plain_data():
    cfg = RunConfig(model=tiny())
    info = describe(GPT(cfg.model, V), cfg, shapes=(2, 5))
    assert set(info) == {"vocab_size", "parameters", "flops_per_token", "shapes", "config"}
    assert info["config"]["model"]["pos_encoding"] == "learned"
    assert info["shapes"][-1]["shape"] == [2, 5, V]


def test_a_checkpoint_not_yet_evaluated_has_no_best_val_loss_and_valid_json():
    """A run stopped before its first evaluation has best_val inf: `info --json` says null (JSON
    has no Infinity) and the text says so in words."""
    import json
    import math

    from charlm.summary import render_text

    cfg = RunConfig(model=tiny())
    state = {"step": 3, "best_val": math.inf, "tokens": 96}
    info = describe(GPT(cfg.model, V), cfg, train_state=state)
    assert info["checkpoint"] == {"step": 3, "best_val_loss": None, "tokens_seen": 96}
    json.dumps(info, allow_nan=False)  # strict JSON
    assert "best val loss: none yet\n" in render_text(info)
    state["best_val"] = 1.25
    info = describe(GPT(cfg.model, V), cfg, train_state=state)
    assert "best val loss: 1.2500\n" in render_text(info)
