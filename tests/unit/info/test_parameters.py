import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from charlm.config.loading import load_config
from charlm.config.schema import MODEL_VARIANTS, ModelConfig, RunConfig
from charlm.core.errors import CharlmError
from charlm.info.parameters import flops_per_token, parameter_table, seq2seq_flops
from charlm.info.shapes import forward_shapes, seq2seq_forward_shapes
from charlm.info.summary import describe
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT
from charlm.training.loop import train
from tests.helpers import ROOT, expected_params, reversal_pairs, tiny_model_config, write_pairs

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


@pytest.mark.parametrize("override, message", [
    ("model.block_size=1000000000", "error: --shapes: the attention weights (16 x 2 x 1000000000 "
     "x 1000000000) would have 3.2e+19 elements, more than a tensor can hold; give a smaller "
     "--seq-len"),
    ("model.n_layer=1000000", "error: --shapes lists every block, and 1,000,000 are too many to "
     "list; every block has the same shapes: try --set model.n_layer=2"),
])
def test_info_shapes_of_a_huge_model_is_one_error(cli, override, message):
    """A billion positions ended in torch's storage-size RuntimeError (a traceback); a million
    layers built a million meta blocks for minutes."""
    result = cli("info", ROOT / "configs" / "tiny.yaml", "--set", override, "--shapes")
    assert (result.code, result.out, result.err) == (2, "", message + "\n")


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


def seq2seq(cfg: ModelConfig) -> EncoderDecoder:
    return EncoderDecoder(cfg, VS, VT, VS - 1)


@pytest.mark.parametrize("variant", sorted(MODEL_VARIANTS))
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


def test_describe_an_encoder_decoder_is_plain_data():
    cfg = RunConfig(model=tiny_model_config(arch="encoder_decoder"))
    info = describe(seq2seq(cfg.model), cfg, shapes=(2, 5))
    assert set(info) == {"arch", "source_vocab_size", "target_vocab_size", "parameters",
                         "flops_per_token", "shapes", "config"}
    assert (info["source_vocab_size"], info["target_vocab_size"]) == (VS, VT)
    assert info["shapes"][-1] == {"stage": "head", "what": "logits", "shape": [2, 5, VT]}
    json.dumps(info, allow_nan=False)


@pytest.fixture(scope="module")
def pairs_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny encoder-decoder trained for two steps on about 100 reversal pairs."""
    tmp = tmp_path_factory.mktemp("info_pairs")
    tsv = write_pairs(tmp / "reverse.tsv", reversal_pairs(100, 0))
    train(load_config(ROOT / "configs" / "tiny.yaml", [
        "model.arch=encoder_decoder", "model.n_encoder_layer=1", f"data.path={tsv}",
        "data.target_units=space", "data.val_fraction=0.2", f"train.out_dir={tmp / 'run'}",
        "train.max_iters=2", "train.eval_interval=2", "train.eval_pairs=0",
        "train.batch_size=8", "train.eval_iters=1", "train.sample_chars=0"]))
    return tmp / "run"


def test_info_on_an_encoder_decoder_run_checkpoint_and_export(cli, pairs_run, tmp_path):
    from charlm.export import save_safetensors
    from charlm.training.checkpoint import load_model

    model, vocab, cfg, _ = load_model(pairs_run)
    text = cli("info", pairs_run)
    assert (text.code, text.err) == (0, "")
    lines = text.out.splitlines()
    assert lines[:4] == ["architecture: encoder_decoder",
                         f"source vocab size: {vocab.source_size}",
                         f"target vocab size: {vocab.target_size}", "step: 2"]
    for row in ("cross-attention k weight", "layernorm before cross-attention weight",
                "all encoder layers (x 1)", "all decoder layers (x 2)",
                "head (tied: the target token embedding, no new parameters)"):
        assert any(line.strip().startswith(row) for line in lines), row
    total = next(line for line in lines if line.strip().startswith("total (head tied"))
    assert total.split()[-1] == f"{sum(p.numel() for p in model.parameters()):,}"
    assert "FLOPs per target token" in text.out and "forward pass" not in text.out
    from_run = json.loads(cli("info", pairs_run, "--json").out)
    assert from_run == json.loads(cli("info", pairs_run / "last.pt", "--json").out)
    assert from_run["checkpoint"]["step"] == 2
    save_safetensors(model, vocab, cfg, tmp_path / "st")
    from_export = cli("info", tmp_path / "st", "--json")
    assert from_export.code == 0, from_export.err
    del from_run["checkpoint"]
    assert json.loads(from_export.out) == from_run


def test_info_on_an_encoder_decoder_config_reads_its_pairs(cli, pairs_run):
    """A config's two vocabularies come from data.path: its .tsv of pairs (the run's
    config.yaml), or a dataset dir made from them, as the run's own were."""
    from_run = json.loads(cli("info", pairs_run, "--json").out)
    config = pairs_run / "config.yaml"
    for args in ([], ["--set", f"data.path={pairs_run / 'dataset'}"]):
        result = cli("info", config, "--json", *args)
        assert result.code == 0, result.err
        info = json.loads(result.out)
        for key in ("source_vocab_size", "target_vocab_size", "parameters", "flops_per_token"):
            assert info[key] == from_run[key], (args, key)
    for args, error in [
        (["--vocab-size", "40"], "--vocab-size gives one vocabulary, and "
         "model.arch=encoder_decoder has two (source and target); drop it: both come from "
         "data.path"),
        (["--set", f"data.path={pairs_run / 'nope.tsv'}"], "the source and target "
         f"vocabularies come from data.path, and {pairs_run / 'nope.tsv'} does not exist; "
         "--set data.path=FILE (a .tsv of pairs, or a dataset made by `charlm prepare --pairs`)"),
    ]:
        assert (cli("info", config, *args).err) == f"error: {error}\n"
    assert cli("info", config, "--set", "data.format=text").err.startswith(
        "error: model.arch=encoder_decoder trains on pairs, but ")


def test_info_shapes_of_an_encoder_decoder(cli, pairs_run):
    result = cli("info", pairs_run, "--shapes", "--batch", "3", "--seq-len", "7")
    assert (result.code, result.err) == (0, "")
    out = result.out
    for line in [
        "  src                               3 x 7               source ids",
        "    key padding mask                3 x 1 x 1 x 7       True = a real source position",
        "  memory                            3 x 7 x 32          the encoder's output",
        "  blocks.1.cross_attn.kv            3 x 7 x 64          block 1 cross-attention k, v "
        "of the memory",
        "    k, v                            3 x 2 x 7 x 16      split into heads (each), once "
        "per source",
        "  tgt_in                            3 x 7               target ids (bos, then the "
        "target)",
        "  blocks.0.cross_attn.q             3 x 7 x 32          cross-attention q",
        "    q                               3 x 2 x 7 x 16      split into heads",
        "    softmax(q k^T / sqrt(D))        3 x 2 x 7 x 7       weights over the memory's keys, "
        "padding masked",
        "  blocks.0.cross_attn.proj          3 x 7 x 32          cross-attention output (o)",
        "  head                              3 x 7 x 10          logits",
    ]:
        assert f"\n{line}\n" in out, line
    assert out.count("split into heads (each), once per source") == 2  # one per decoder layer
    default = cli("info", pairs_run, "--shapes").out  # train.batch_size x block_size
    assert "  memory                            8 x 16 x 32         the encoder's output\n" in \
        default
