"""charlm.model.encoder_decoder: causality, padding, the loss, options that reach both stacks,
parameter counts."""

import pytest
import torch

from charlm.model.encoder_decoder import EncoderDecoder, parameter_count
from charlm.model.gpt import RMSNorm, param_counts
from tests.helpers import (
    PAD,
    PAIR_VARIANTS,
    SRC_PAD,
    VS,
    VT,
    random_seq2seq,
    seq2seq_batch,
    seq2seq_config,
)


@pytest.mark.parametrize("variant", PAIR_VARIANTS)
def test_decoder_is_causal_and_reads_the_whole_source(variant):
    model = random_seq2seq(**PAIR_VARIANTS[variant])
    src = torch.randint(0, SRC_PAD, (2, 6))
    tgt = torch.randint(0, PAD, (2, 9))
    base, _ = model(src, tgt)
    later = tgt.clone()
    later[:, 5] = (tgt[:, 5] + 1) % PAD
    changed, _ = model(src, later)
    assert torch.equal(changed[:, :5], base[:, :5])  # a target position sees no later one
    assert not torch.allclose(changed[:, 5:], base[:, 5:])
    last = src.clone()
    last[:, -1] = (src[:, -1] + 1) % SRC_PAD
    first_position, _ = model(last, tgt[:, :1])
    assert not torch.allclose(first_position[:, 0], base[:, 0])  # every source char is seen
    # and the encoder is bidirectional: its first position sees the last
    assert not torch.allclose(model.encode(last).out[:, 0], model.encode(src).out[:, 0])


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_decoder_block_follows_its_definition(placement):
    model = random_seq2seq(norm_placement=placement, bias=True)  # norms with random weights
    block, x = model.blocks[0], torch.randn(2, 5, 32)
    src, _, _ = seq2seq_batch([[1, 2, 3, 4], [5, 6]], [[0]] * 2)
    k, v, mask = cross = model.encode(src).cross(0)
    out = block(x, None, 0, None, None, cross)
    if placement == "pre":  # x + f(norm(x)) for each of the three sublayers
        h = x + block.attn(block.ln_1(x))
        h = h + block.cross_attn(block.ln_cross(h), k, v, mask)
        expected = h + block.mlp(block.ln_2(h))
    else:  # norm(x + f(x)), and no final norm after either stack
        h = block.ln_1(x + block.attn(x))
        h = block.ln_cross(h + block.cross_attn(h, k, v, mask))
        expected = block.ln_2(h + block.mlp(h))
        assert isinstance(model.ln_enc, torch.nn.Identity)
        assert isinstance(model.ln_f, torch.nn.Identity)
    torch.testing.assert_close(out, expected)


def test_options_reach_both_stacks():
    both = random_seq2seq(pos_encoding="learned", activation="swiglu", norm="rmsnorm", bias=True)
    assert both.src_wpe.weight.shape == both.wpe.weight.shape == (16, 32)  # separate tables
    for block in (both.encoder[0], both.blocks[0]):
        assert block.mlp.fc.weight.shape == (2 * 88, 32)  # swiglu's fused gate and up
        assert isinstance(block.ln_1, RMSNorm) and block.attn.qkv.bias is not None
    assert isinstance(both.blocks[0].ln_cross, RMSNorm)
    assert both.blocks[0].cross_attn.q.bias is not None
    assert not hasattr(both.encoder[0], "cross_attn")
    rope = random_seq2seq(pos_encoding="rope")
    assert not hasattr(rope, "src_wpe") and not hasattr(rope, "wpe")
    assert rope.head.weight is rope.wte.weight  # tied to the target's table
    assert random_seq2seq(tie_weights=False).head.weight is not random_seq2seq().wte.weight
    dropout = random_seq2seq(dropout=0.3).train()
    src, tgt_in, _ = seq2seq_batch([[1, 2, 3]], [[4, 5]])
    assert not torch.equal(dropout.encode(src).out, dropout.encode(src).out)
    assert not torch.equal(dropout(src, tgt_in)[0], dropout(src, tgt_in)[0])
    dropout.eval()
    assert torch.equal(dropout(src, tgt_in)[0], dropout(src, tgt_in)[0])


@pytest.mark.parametrize("variant", PAIR_VARIANTS)
def test_padding_changes_no_real_position(variant):
    model = random_seq2seq(**PAIR_VARIANTS[variant])
    sources, targets = [[1, 2, 3], [4, 0, 6, 5, 2, 1]], [[3, 1, 4, 1], [5, 9 - 1]]
    alone = [model(*seq2seq_batch([s], [t])[:2])[0][0]
             for s, t in zip(sources, targets, strict=True)]
    # a longer third source, extra padding columns on both sides
    src, tgt_in, _ = seq2seq_batch([*sources, [2] * 9], [*targets, [0] * 7], S=11, T=10)
    padded, _ = model(src, tgt_in)
    for row, (logits, t) in enumerate(zip(alone, targets, strict=True)):
        torch.testing.assert_close(padded[row, :len(t) + 1], logits, rtol=1e-5, atol=1e-5)


def test_loss_is_the_mean_over_real_target_positions():
    model = random_seq2seq()
    sources, targets = [[1, 2, 3], [4, 0, 6, 5]], [[3, 1, 4, 1, 5], [2, 6]]
    src, tgt_in, tgt_out = seq2seq_batch(sources, targets)
    logits, loss = model(src, tgt_in, tgt_out)
    real = tgt_out != -1
    expected = -torch.log_softmax(logits[real], -1).gather(1, tgt_out[real][:, None]).mean()
    torch.testing.assert_close(loss, expected)
    _, padded = model(*seq2seq_batch(sources, targets, S=9, T=12))
    torch.testing.assert_close(padded, loss, rtol=1e-5, atol=1e-6)


def test_param_counts_by_component():
    cfg = seq2seq_config(bias=True, tie_weights=False, pos_encoding="learned")
    model = EncoderDecoder(cfg, VS, VT, SRC_PAD)
    counts = param_counts(model)
    C, F, T = 32, 128, 16
    attn = 4 * C * C + 4 * C
    mlp = 2 * C * F + F + C
    norm = 2 * C
    assert counts == {
        "embeddings": (VS + T + VT + T) * C,
        "encoder": 3 * (attn + mlp + 2 * norm) + norm,
        "decoder_self_attention": 2 * attn, "cross_attention": 2 * attn,
        "decoder_mlp": 2 * mlp, "decoder_norms": 2 * 3 * norm + norm, "head": VT * C,
        "total": sum(p.numel() for p in model.parameters()),
    }
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert parameter_count(cfg, VS, VT) == counts["total"]
    deep = seq2seq_config(n_layer=7, n_encoder_layer=5)
    assert parameter_count(deep, VS, VT) == param_counts(EncoderDecoder(deep, VS, VT, SRC_PAD))[
        "total"]
    tied = EncoderDecoder(seq2seq_config(), VS, VT, SRC_PAD)
    assert param_counts(tied)["head"] == 0  # tied to wte
