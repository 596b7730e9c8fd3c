"""charlm.info.shapes: the shapes of one forward pass, stage by stage."""

import dataclasses

import pytest

from charlm.core.errors import CharlmError
from charlm.info.shapes import forward_shapes, seq2seq_forward_shapes
from tests.helpers import tiny_model_config

V = 11


def stage_shapes(stages):
    return {s["stage"].strip(): s["shape"] for s in stages}


def test_forward_shapes_follow_one_forward_pass():
    cfg = tiny_model_config(activation="swiglu", pos_encoding="rope")
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
    shapes = stage_shapes(forward_shapes(tiny_model_config(pos_encoding="sinusoidal"), V, 2, 7))
    assert shapes["wte"] == [2, 7, 32] and shapes["sinusoid table"] == [7, 32]
    assert "wpe" not in shapes and "rope" not in shapes


def test_forward_shapes_show_post_norm_order():
    names = [s["stage"] for s in forward_shapes(tiny_model_config(norm_placement="post"), V, 1, 4)]
    assert names.index("blocks.0.attn.proj") < names.index("blocks.0.ln_1")
    assert names.index("blocks.0.mlp.proj") < names.index("blocks.0.ln_2")
    assert "ln_f" not in names and "wpe" in names


def test_forward_shapes_refuse_a_sequence_longer_than_the_block():
    with pytest.raises(CharlmError, match=r"--seq-len 17 must be in 1..block_size \(16\)"):
        forward_shapes(tiny_model_config(), V, 1, 17)


# The encoder-decoder (charlm.seq2seq): source and target vocabularies of VS and VT ids.
VS, VT = 9, 12


def test_seq2seq_forward_shapes_show_the_memory_and_the_cross_attention():
    cfg = tiny_model_config(arch="encoder_decoder", n_encoder_layer=1, activation="swiglu",
                            pos_encoding="rope")
    stages = seq2seq_forward_shapes(cfg, VS, VT, batch=3, seq_len=7)
    seen = [(s["stage"].strip(), s["shape"]) for s in stages]
    B, T, H, D = 3, 7, 2, 16
    assert seen[:3] == [("src", [B, T]), ("src_wte", [B, T, 32]), ("encoder.0.ln_1", [B, T, 32])]
    encoder = seen[:seen.index(("memory", [B, T, 32]))]
    assert ("key padding mask", [B, 1, 1, T]) in encoder and ("rope", [B, H, T, D]) in encoder
    assert ("softmax(q k^T / sqrt(D))", [B, H, T, T]) in encoder
    at = seen.index(("memory", [B, T, 32]))
    assert seen[at - 2:at + 7] == [
        ("encoder.0", [B, T, 32]), ("ln_enc", [B, T, 32]), ("memory", [B, T, 32]),
        ("blocks.0.cross_attn.kv", [B, T, 64]), ("k, v", [B, H, T, D]),
        ("blocks.1.cross_attn.kv", [B, T, 64]), ("k, v", [B, H, T, D]),
        ("tgt_in", [B, T]), ("wte", [B, T, 32])]
    cross = seen.index(("blocks.0.cross_attn.q", [B, T, 32]))
    assert seen[cross - 2:cross + 6] == [
        ("blocks.0.attn.proj", [B, T, 32]), ("blocks.0.ln_cross", [B, T, 32]),
        ("blocks.0.cross_attn.q", [B, T, 32]), ("q", [B, H, T, D]),
        ("softmax(q k^T / sqrt(D))", [B, H, T, T]), ("weights @ v", [B, H, T, D]),
        ("merge heads", [B, T, 32]), ("blocks.0.cross_attn.proj", [B, T, 32])]
    assert stages[cross + 2]["what"] == "weights over the memory's keys, padding masked"
    assert ("silu(gate) * up", [B, T, 88]) in seen[cross:]
    assert seen[-3:] == [("blocks.1", [B, T, 32]), ("ln_f", [B, T, 32]), ("head", [B, T, VT])]
    post = [s["stage"] for s in seq2seq_forward_shapes(
        dataclasses.replace(cfg, norm_placement="post"), VS, VT, 1, 4)]
    assert "ln_enc" not in post and post[post.index("memory") - 1] == "encoder.0"
