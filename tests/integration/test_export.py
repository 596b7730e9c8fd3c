"""`charlm export` of a trained run: safetensors and Hugging Face exports that load and sample as
the run does, damaged exports, and the dirs an export refuses to overwrite."""

import importlib.util
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from charlm.export import load_safetensors, save_hf, save_safetensors
from charlm.training import checkpoint
from tests.helpers import SHAKESPEARE

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def test_safetensors_round_trip_gives_identical_logits(run_dir, tmp_path):
    model, vocab, cfg, _ = checkpoint.load_model(run_dir)
    save_safetensors(model, vocab, cfg, tmp_path / "st")
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == [
        "config.json", "model.safetensors", "vocab.json"]
    assert json.loads((tmp_path / "st" / "vocab.json").read_text(encoding="utf-8")) == vocab.chars
    loaded, vocab2, cfg2 = load_safetensors(tmp_path / "st")
    idx = torch.tensor([vocab.encode("First Citizen:")])
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    assert vocab2 == vocab and cfg2 == cfg
    assert loaded.head.weight is loaded.wte.weight  # still tied


def test_cli_export_then_sample_and_eval_from_the_export(cli, run_dir, tmp_path):
    out = tmp_path / "exported"
    result = cli("export", run_dir, "--format", "safetensors", "--out", out)
    assert (result.code, result.out) == (0, f"wrote {out} (safetensors)\ncontext: 16 characters "
                                            "(model.block_size)\n")
    args = ["--temperature", "0", "--max-new-tokens", "30", "--prompt", "KING"]
    assert cli("sample", out, *args).out == cli("sample", run_dir, *args).out
    text = tmp_path / "t.txt"
    text.write_text(SHAKESPEARE.read_text(encoding="utf-8")[10_000:13_000], encoding="utf-8")
    a, b = cli("eval", out, text, "--json"), cli("eval", run_dir, text, "--json")
    assert a.code == 0 and json.loads(a.out) == json.loads(b.out)
    assert json.loads(a.out)["chars_scored"] == 2999


def test_cli_export_rejects_unknown_format(cli, run_dir, tmp_path):
    result = cli("export", run_dir, "--format", "gguf", "--out", tmp_path / "x")
    assert (result.code, result.err) == (2, "error: --format must be safetensors, hf or onnx, "
                                            "got 'gguf'\n")
    assert not (tmp_path / "x").exists()


def test_cli_export_refuses_a_non_empty_dir_and_overwrite_replaces_it_whole(cli, run_dir,
                                                                          tmp_path):
    out = tmp_path / "exported"
    out.mkdir()
    (out / "config.json").write_text("my notes")
    for more in ([], ["--overwrite"]):  # the user's config.json is no export to replace
        result = cli("export", run_dir, "--out", out, *more)
        assert (result.code, result.err) == (
            2, f"error: --out {out} holds files that are not an earlier export (config.json); "
               "give a new or empty directory, or an earlier export to replace\n")
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert (out / "config.json").read_text() == "my notes"
    (out / "config.json").unlink()
    assert cli("export", run_dir, "--out", out).code == 0
    result = cli("export", run_dir, "--out", out)
    assert (result.code, result.err) == (2, f"error: --out {out} holds an earlier export; give "
                                            "a new directory, or --overwrite to replace it\n")
    assert cli("export", run_dir, "--out", out, "--overwrite").code == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "vocab.json"]
    assert cli("export", run_dir, "--out", out, "--format", "hf", "--overwrite").code == 0
    assert not (out / "vocab.json").exists()  # nothing of the safetensors export lingers
    assert (out / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]  # no temporary dirs left
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli("export", run_dir, "--out", empty).code == 0  # an empty dir is fine


def test_export_into_a_symlink_or_the_current_dir_fills_the_dir_it_names(cli, run_dir,
                                                                         tmp_path, monkeypatch):
    files = ["config.json", "model.safetensors", "vocab.json"]
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "notes.txt").write_text("mine")
    (tmp_path / "link").symlink_to("target")
    (tmp_path / "dangling").symlink_to("elsewhere")
    result = cli("export", run_dir, "--out", tmp_path / "link", "--overwrite")
    assert result.code == 2 and "(notes.txt)" in result.err  # the user's notes stay
    (tmp_path / "target" / "notes.txt").unlink()
    assert cli("export", run_dir, "--out", tmp_path / "link").code == 0
    assert cli("export", run_dir, "--out", tmp_path / "link", "--overwrite").code == 0
    assert cli("export", run_dir, "--out", tmp_path / "dangling").code == 0
    # the links stay links, the export is where they point, no temporary names are left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "elsewhere", "link",
                                                          "target"]
    assert (tmp_path / "link").readlink() == Path("target")
    assert sorted(p.name for p in (tmp_path / "target").iterdir()) == files
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == files
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    result = cli("export", run_dir, "--out", ".")
    assert (result.code, result.out, result.err) == (
        0, "wrote . (safetensors)\ncontext: 16 characters (model.block_size)\n", "")
    assert sorted(p.name for p in (tmp_path / "here").iterdir()) == files
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    result = cli("export", run_dir, "--out", tmp_path / "a")
    assert (result.code, result.out, result.err) == (
        2, "", f"error: --out {tmp_path / 'a'} is a loop of symbolic links; give a directory\n")


def test_hf_export_writes_gpt2_names_and_config(run_dir, tmp_path):
    model, vocab, cfg, _ = checkpoint.load_model(run_dir)
    save_hf(model, vocab, cfg, tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["vocab_size"] == len(vocab)
    assert (config["n_layer"], config["n_embd"], config["n_positions"]) == (2, 32, 16)
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "hf" / "model.safetensors"))
    qkv = model.blocks[0].attn.qkv.weight
    assert torch.equal(weights["transformer.h.0.attn.c_attn.weight"], qkv.t())
    assert torch.equal(weights["transformer.h.0.attn.c_attn.bias"], torch.zeros(3 * 32))


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers not installed (the hf extra)")
def test_hf_export_loads_in_transformers_with_matching_logits(run_dir, tmp_path):
    from transformers import AutoTokenizer, GPT2LMHeadModel

    model, vocab, cfg, _ = checkpoint.load_model(run_dir)
    save_hf(model, vocab, cfg, tmp_path / "hf")
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    text = "ROMEO:\nWhat, ho! is there  a man , here?"
    text = "".join(c for c in text if c in vocab.index)
    ids = tok(text)["input_ids"]
    assert ids == vocab.encode(text)
    assert tok.decode(ids) == text
    x = torch.tensor([ids[:16]])
    with torch.no_grad():
        diff = (hf(x).logits - model(x)[0]).abs().max().item()
    assert diff <= 1e-4


def test_sample_on_an_hf_export_says_it_is_for_transformers(cli, run_dir, tmp_path):
    model, vocab, cfg, _ = checkpoint.load_model(run_dir)
    save_hf(model, vocab, cfg, tmp_path / "hf")
    result = cli("sample", tmp_path / "hf")
    assert (result.code, result.out) == (2, "")
    assert result.err == (
        f"error: cannot load exported model {tmp_path / 'hf'}: config.json is not a charlm export "
        "(an `hf` export is for transformers, not for charlm)\n")


def _damage_weights(edit):
    def damage(d):
        from safetensors.torch import load_file, save_file

        weights = load_file(str(d / "model.safetensors"))
        edit(weights)
        save_file(weights, str(d / "model.safetensors"))
    return damage


def _damage_config(edit):
    def damage(d):
        meta = json.loads((d / "config.json").read_text(encoding="utf-8"))
        (d / "config.json").write_text(json.dumps(edit(meta)), encoding="utf-8")
    return damage


@pytest.mark.parametrize("damage, detail", [
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:300]),
     "Error while deserializing header"),
    (_damage_config(lambda meta: [meta]), "config.json is not a charlm export"),
    (_damage_config(lambda meta: {**meta, "config": None}), "no config"),
    (_damage_config(lambda meta: {**meta, "config": {**meta["config"], "model": None}}),
     "config is not a mapping with a model section"),
    (_damage_weights(lambda w: w.update({"head.weight": torch.zeros_like(w["wte.weight"])})),
     "weights do not match the config (missing [], unexpected ['head.weight'])"),
    (_damage_weights(lambda w: w.update({"wte.weight": w["wte.weight"][:10]})),
     "wte.weight has shape (10, 32) in the weights but (65, 32) in the config"),
])
def test_damaged_export_gives_one_error_line_to_every_command(cli, run_dir, tmp_path, damage,
                                                             detail):
    export_dir = tmp_path / "exported"
    assert cli("export", run_dir, "--out", export_dir).code == 0
    damage(export_dir)
    before = {p.name: p.read_bytes() for p in export_dir.iterdir()}
    text = tmp_path / "t.txt"
    text.write_text("First Citizen:\n", encoding="utf-8")
    for command in (["sample"], ["eval", text], ["info"], ["export", "--out", tmp_path / "x"]):
        result = cli(command[0], export_dir, *command[1:])
        assert (result.code, result.out) == (2, "")
        assert result.err.startswith(f"error: cannot load exported model {export_dir}: {detail}")
        assert result.err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in export_dir.iterdir()} == before
    assert not (tmp_path / "x").exists()


def test_export_refuses_to_overwrite_the_dir_that_holds_its_own_model(cli, run_dir, tmp_path):
    run = tmp_path / "runs" / "run"
    shutil.copytree(run_dir, run)
    before = {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for target, out in ((run, run), (run / "last.pt", tmp_path / "runs")):
        result = cli("export", target, "--out", out, "--overwrite")
        source = run / "best.pt" if target == run else target
        assert (result.code, result.out, result.err) == (
            2, "", f"error: --out {out} holds the model being exported ({source}); give another "
                   "directory\n")
    assert {str(p): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    export_dir = tmp_path / "exported"
    assert cli("export", run, "--out", export_dir).code == 0
    result = cli("export", export_dir, "--out", export_dir, "--overwrite")
    assert (result.code, result.err) == (2, f"error: --out {export_dir} holds the model being "
                                            f"exported ({export_dir}); give another directory\n")
    assert cli("sample", export_dir, "--max-new-tokens", "5").code == 0


def test_export_refuses_to_overwrite_a_part_of_the_run(cli, run_dir, tmp_path):
    """`--out RUN/tb --overwrite` replaced the run's TensorBoard logs with the export."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "dataset").mkdir(exist_ok=True)
    (run / "dataset" / "meta.json").write_text("{}")
    before = {str(p): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for part in ("tb", "dataset"):
        result = cli("export", run, "--out", run / part, "--overwrite")
        assert (result.code, result.out, result.err) == (
            2, "", f"error: --out {run / part} is part of the run in {run}; give a directory "
                   "outside it (or an earlier export)\n")
    assert {str(p): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert cli("export", run, "--out", run / "export").code == 0  # a new dir in the run is fine
    assert cli("export", run, "--out", run / "export", "--overwrite").code == 0


def test_exported_weights_follow_the_umask_as_the_other_files_do(cli, run_dir, tmp_path):
    """model.safetensors was written 0600 (safetensors' save_file) while config.json followed
    the umask."""
    old = os.umask(0o022)
    try:
        assert cli("export", run_dir, "--out", tmp_path / "e").code == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "e").iterdir()}
    assert set(modes.values()) == {0o644}, modes
