"""`charlm info` on trained runs, their checkpoints and exports, of a GPT and of an
encoder-decoder."""

import json
from pathlib import Path

import pytest

from charlm.config.loading import load_config
from charlm.training.loop import train
from tests.helpers import ROOT, reversal_pairs, write_pairs


def test_info_on_run_dir_and_config(cli, tiny_run):
    result = cli("info", tiny_run)
    assert result.code == 0
    assert "vocab size: " in result.out and "step: 60" in result.out
    assert "total" in result.out and "n_layer: 2" in result.out
    assert "forward pass" not in result.out  # only with --shapes
    from_config = cli("info", ROOT / "configs" / "shakespeare_char.yaml")
    assert from_config.code == 0
    lines = from_config.out.splitlines()
    total = next(line for line in lines if line.strip().startswith("total"))
    assert total.split()[-1] == "10,745,088"
    assert "position embedding (learned)" in from_config.out
    training = next(line for line in lines if line.strip().startswith("training"))
    assert training.split()[-1] == f"{6 * 10_646_784 + 12 * 6 * 384 * 256:,}"


def test_info_json_with_shapes(cli, tiny_run):
    result = cli("info", tiny_run, "--json", "--shapes", "--batch", "3", "--seq-len", "5")
    assert result.code == 0, result.err
    info = json.loads(result.out)
    vocab = info["vocab_size"]
    assert info["checkpoint"]["step"] == 60
    assert info["parameters"]["total"] == sum(
        r["params"] for r in info["parameters"]["rows"] if r["section"] != "layer"
    ) + 2 * info["parameters"]["per_layer"]
    assert info["flops_per_token"]["context"] == 16
    assert info["shapes"][0]["shape"] == [3, 5]
    assert info["shapes"][-1] == {"stage": "head", "what": "logits", "shape": [3, 5, vocab]}
    assert info["config"]["model"]["n_layer"] == 2
    text = cli("info", tiny_run, "--shapes")  # defaults: train.batch_size x block_size
    assert "  head                              16 x 16 x " in text.out


def test_info_on_a_safetensors_export_dir(cli, tiny_run, tmp_path):
    from charlm.export import save_safetensors
    from charlm.training.checkpoint import load_model

    model, vocab, cfg, _ = load_model(tiny_run)
    save_safetensors(model, vocab, cfg, tmp_path / "st")
    from_export = cli("info", tmp_path / "st", "--json")
    assert from_export.code == 0, from_export.err
    from_run = json.loads(cli("info", tiny_run, "--json").out)
    info = json.loads(from_export.out)
    assert "checkpoint" not in info
    del from_run["checkpoint"]
    assert info == from_run


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


def test_info_says_how_a_runs_data_was_split_and_what_was_skipped(cli, tmp_path):
    """data.split files over a folder with an empty file skipped: `charlm info RUN` says which
    split, how many files, the tokens of each side and what was skipped."""
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    text = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    for i in range(3):
        (folder / "sub" / f"f{i}.txt").write_text(text[i * 5000:(i + 1) * 5000])
    (folder / "empty.py").write_text("")
    run = tmp_path / "run"
    assert cli("train", ROOT / "configs" / "tiny.yaml", folder, "--skip-invalid", "--out", run,
               "--set", "data.split=files", "--set", "data.val_fraction=0.3",
               "--set", "train.max_iters=1").code == 0
    meta = json.loads((run / "dataset" / "meta.json").read_text())
    val = sum(s["chars"] for s in meta["sources"] if s["split"] == "val")
    assert 0 < val < 15_000 and all(s["split"] in ("train", "val") for s in meta["sources"])
    info = cli("info", run)
    assert (f"data: 3 files, split files, {15_000 - val:,} train / {val:,} val characters; "
            "skipped 1 empty") in info.out.splitlines()
    assert json.loads(cli("info", run, "--json").out)["data"] == {
        "split": "files", "units": "char", "files": 3, "skipped": "1 empty",
        "train_tokens": 15_000 - val, "val_tokens": val}
