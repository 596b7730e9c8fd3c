"""charlm.info.parameters: the parameter table and FLOPs of a GPT and of an encoder-decoder,
against formulas written from the definitions."""

import dataclasses
import itertools

import pytest

from charlm.config.schema import MODEL_VARIANTS, ModelConfig
from charlm.info.parameters import flops_per_token, parameter_table, seq2seq_flops
from charlm.info.shapes import seq2seq_forward_shapes
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT
from tests.helpers import expected_params, tiny_model_config

V = 11


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_table_totals_match_the_formula_tied_and_untied(activation):
    for bias, tie, pos, norm, placement in itertools.product(
            [False, True], [False, True], ["learned", "sinusoidal", "rope", "none"],
            ["layernorm", "rmsnorm"], ["pre", "post"]):
        cfg = tiny_model_config(bias=bias, tie_weights=tie, activation=activation, pos_encoding=pos,
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
    table = parameter_table(GPT(tiny_model_config(), V))
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
    cfg = tiny_model_config(activation="swiglu", pos_encoding="rope", norm="rmsnorm",
                            norm_placement="post", tie_weights=False, bias=True)
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


# The encoder-decoder (charlm.seq2seq): source and target vocabularies of VS and VT ids.
VS, VT = 9, 12


def seq2seq(cfg: ModelConfig) -> EncoderDecoder:
    return EncoderDecoder(cfg, VS, VT, VS - 1)


@pytest.mark.parametrize("variant", sorted(set(MODEL_VARIANTS) - {"bigram=True"}))
def test_seq2seq_table_adds_up_for_every_variant_tied_and_untied(variant):
    for tie in (True, False):
        cfg = tiny_model_config(**{**MODEL_VARIANTS[variant], "tie_weights": tie},
                                arch="encoder_decoder", n_encoder_layer=3)
        model = seq2seq(cfg)
        table = parameter_table(model)
        assert table["total"] == sum(p.numel() for p in model.parameters()), cfg  # tied once
        assert table["total_untied"] - table["total_tied"] == VT * 32
        assert table["total"] == table["total_tied" if tie else "total_untied"]
        assert (table["encoder"]["n_layer"], table["decoder"]["n_layer"]) == (3, 2)
        sections = {r["section"] for r in table["rows"]}
        assert sections == {"embedding", "encoder layer", "encoder output", "decoder layer",
                            "output"}
        one = dataclasses.replace(cfg, n_layer=1, n_encoder_layer=1)  # stands for the deep one
        assert parameter_table(seq2seq(one), 2, 3) == table, cfg
        assert seq2seq_forward_shapes(cfg, VS, VT, 2, 5)[-1]["shape"] == [2, 5, VT]


def test_seq2seq_table_rows_name_the_cross_attention():
    cfg = tiny_model_config(arch="encoder_decoder", n_encoder_layer=1, bias=True, tie_weights=False)
    table = parameter_table(seq2seq(cfg))
    rows = {(r["section"], r["component"]): (r["shape"], r["params"]) for r in table["rows"]}
    for part in "qkv":  # k and v are the halves of the fused kv
        assert rows["decoder layer", f"cross-attention {part} weight"] == ([32, 32], 1024)
        assert rows["decoder layer", f"cross-attention {part} bias"] == ([32], 32)
    assert rows["decoder layer", "cross-attention o weight"] == ([32, 32], 1024)
    assert rows["decoder layer", "layernorm before cross-attention weight"] == ([32], 32)
    assert rows["decoder layer", "self-attention q weight"] == ([32, 32], 1024)
    assert not any(c.startswith("cross") for s, c in rows if s == "encoder layer")
    assert rows["embedding", "source token embedding"] == ([VS, 32], VS * 32)
    assert rows["embedding", "target position embedding (learned)"] == ([16, 32], 16 * 32)
    assert rows["encoder output", "encoder final layernorm weight"] == ([32], 32)
    assert rows["output", "head"] == ([VT, 32], VT * 32)
    attn, mlp, norm = 4 * (1024 + 32), 2 * 4096 + 128 + 32, 2 * 32
    assert table["encoder"]["per_layer"] == attn + mlp + 2 * norm
    assert table["decoder"]["per_layer"] == 2 * attn + mlp + 3 * norm
    post = parameter_table(seq2seq(dataclasses.replace(cfg, norm_placement="post")))["rows"]
    assert [(r["component"], r["params"]) for r in post if r["section"].endswith("output")] == [
        ("encoder final norm (none: post-norm blocks end in a norm)", 0),
        ("decoder final norm (none: post-norm blocks end in a norm)", 0), ("head", VT * 32)]


def test_seq2seq_flops_count_each_side_per_its_positions():
    # tied head, learned positions
    cfg = tiny_model_config(arch="encoder_decoder", n_encoder_layer=1)
    C, S, L = 32, 16, 2
    table = parameter_table(seq2seq(cfg))
    flops = seq2seq_flops(table, cfg, VS, VT)
    encoder = 12 * C * C + 2 * C + C  # one layer and the final norm, no biases
    kv = 2 * C * C  # each decoder layer's k, v projection of the memory
    decoder = L * (16 * C * C + 3 * C - kv) + C + VT * C  # the rest, the final norm, the head
    assert (flops["N_source"], flops["N_target"]) == (encoder + L * kv, decoder)
    n = encoder + L * kv + decoder
    assert flops["N"] == n == table["total_untied"] - (VS + VT) * C - 2 * S * C
    assert flops["training"] == 6 * n + 12 * C * (1 * S + L * (S + S))
    assert flops["encode_source"] == 2 * (encoder + L * kv) * S + 4 * 1 * C * S * S
    assert flops["decode_step"] == 2 * decoder + 4 * L * C * (S + S)


@pytest.mark.parametrize("variant", sorted(MODEL_VARIANTS))
def test_the_table_adds_up_for_every_gpt_variant(variant):
    model = GPT(tiny_model_config(**MODEL_VARIANTS[variant]), V)
    table = parameter_table(model)  # raises unless its rows add up to the model's
    assert table["total"] == sum(p.numel() for p in model.parameters())
    if variant == "bigram=True":
        assert {"section": "embedding", "component": "bigram table (previous, current)",
                "shape": [(V + 1) * V, 32], "params": (V + 1) * V * 32} in table["rows"]
