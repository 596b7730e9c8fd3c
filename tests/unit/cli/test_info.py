"""`charlm info` on a config: counts of huge configs without building them, `--shapes`, and its
option errors."""

from __future__ import annotations

import io
import json
import os
import time

import pytest

from tests.helpers import (
    ROOT,
    TINY,
    files_under,
)


def test_info_set_overrides_the_architecture_of_a_config(cli):
    result = cli("info", ROOT / "configs" / "tiny.yaml", "--vocab-size", "65", "--json",
                 "--set", "model.activation=swiglu", "--set", "model.pos_encoding=rope")
    rows = {r["component"]: r["params"] for r in json.loads(result.out)["parameters"]["rows"]}
    assert rows["mlp gate weight"] == 88 * 32
    assert rows["position encoding (rotary, applied to q and k)"] == 0
    bad = cli("info", ROOT / "configs" / "tiny.yaml", "--vocab-size", "65", "--shapes",
              "--seq-len", "17")
    assert (bad.code, bad.err) == (2, "error: --seq-len 17 must be in 1..block_size (16)\n")
    typo = cli("info", ROOT / "configs" / "tiny.yaml", "--set", "model.pos_encoding=alibi")
    assert typo.code == 2 and "expected one of 'learned', 'sinusoidal', 'rope', 'none'" in typo.err


def test_info_on_a_config_too_big_for_memory_builds_no_weights(cli):
    C, V, T, L = 1 << 17, 10, 16, 2  # 12 * C^2 float32 weights per layer: 824 GB for 2 layers
    result = cli("info", ROOT / "configs" / "tiny.yaml", "--vocab-size", V, "--json", "--shapes",
                 "--set", f"model.n_embd={C}")
    assert result.code == 0, result.err
    info = json.loads(result.out)
    assert info["parameters"]["total"] == V * C + T * C + L * (12 * C * C + 2 * C) + C


def test_info_on_a_config_of_a_billion_layers_builds_one(cli):
    """The table of a config comes from a one-layer model on the meta device (the blocks are
    alike): it built all n_layer blocks, for hours at model.n_layer=1000000000."""
    C, V, T, L = 32, 10, 16, 10**9  # tiny.yaml: 12 C^2 + 2 C parameters a block, no biases
    result = cli("info", ROOT / "configs" / "tiny.yaml", "--vocab-size", V, "--json",
                 "--set", f"model.n_layer={L}")
    assert result.code == 0, result.err
    info = json.loads(result.out)
    assert info["parameters"]["total"] == V * C + T * C + L * (12 * C * C + 2 * C) + C


@pytest.mark.parametrize("args, message", [
    (["--vocab-size", "0"], "--vocab-size must be >= 1, got 0"),
    (["--vocab-size", "-3"], "--vocab-size must be >= 1, got -3"),
    (["--shapes", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["--shapes", "--seq-len", "0"], "--seq-len 0 must be in 1..block_size (16)"),
    (["--batch", "4"], "--batch sizes the forward pass of --shapes; add --shapes"),
    (["--seq-len", "8"], "--seq-len sizes the forward pass of --shapes; add --shapes"),
])
def test_info_rejects_bad_sizes(cli, args, message):
    result = cli("info", ROOT / "configs" / "tiny.yaml", *args)
    assert (result.code, result.err, result.out) == (2, f"error: {message}\n", "")


def test_integer_too_large_for_64_bits(fails):
    fails("info", TINY, "--vocab-size", "65", "--set", "model.block_size=99999999999999999999",
          message=f"invalid value for model.block_size in {TINY} with --set overrides: "
                  "99999999999999999999 is too large")


@pytest.mark.parametrize("option", [["--set", "model.n_layer=3"], ["--vocab-size", "5"]])
def test_config_only_info_options_on_a_checkpoint(fails, tmp_path, option):
    """A checkpoint fixes its config and vocabulary: options that would change them are an error
    rather than silently ignored (checked before the checkpoint is even read)."""
    fails("info", tmp_path / "missing.pt", *option,
          message=f"{option[0]} applies to a config file, not to a checkpoint")


def test_info_on_a_config_whose_data_is_missing_says_how_to_give_the_vocab_size(fails, tmp_path):
    fails("info", TINY, "--set", f"data.path={tmp_path / 'nowhere.txt'}",
          message=f"the vocabulary size comes from data.path, and {tmp_path / 'nowhere.txt'} does "
                  "not exist; give --vocab-size N, or --set data.path=FILE")


def test_info_shapes_of_a_huge_batch_allocate_nothing(cli):
    """`info --shapes` runs its forward on the meta device: a batch of 10**8 costs nothing."""
    t0 = time.perf_counter()
    result = cli("info", TINY, "--shapes", "--batch", "100000000", "--vocab-size", "65")
    assert result.code == 0 and time.perf_counter() - t0 < 5
    assert "head                              100000000 x 16 x 65 logits\n" in result.out


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


def test_info_of_a_symlink_to_a_device_is_one_error(fails, tmp_path):
    """`charlm info z.pt`, z.pt a symlink to /dev/zero: torch read it until a MemoryError."""
    zero = tmp_path / "z.pt"
    zero.symlink_to("/dev/zero")
    fails("info", zero, message=f"cannot read checkpoint {zero}: not a regular file (a "
                                "directory, FIFO or device); give a regular file")


def test_info_on_text_or_nothing_explains_the_model_train_would_build(cli, tmp_path, monkeypatch):
    """`charlm info my.txt` was "not a complete torch.save file" and `charlm info` a missing
    argument, while the README says info explains a model before training: both describe what
    `charlm train` would build with the same argument, the vocabulary read from the text and
    nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "tinyshakespeare.txt").write_text("abcabc\n", encoding="utf-8")
    (tmp_path / "my.txt").write_text("hello, world\n", encoding="utf-8")
    before = files_under(tmp_path)
    text = cli("info", "my.txt", "--json", "--set", "model.n_layer=3")
    defaults = cli("info", "--json")
    assert (text.code, text.err, defaults.code, defaults.err) == (0, "", 0, "")
    assert files_under(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["data", "my.txt"]
    text, defaults = json.loads(text.out), json.loads(defaults.out)
    assert (text["vocab_size"], defaults["vocab_size"]) == (10, 4)
    assert (text["config"]["data"]["path"], text["config"]["model"]["n_layer"]) == ("my.txt", 3)
    sized = cli("info", "--vocab-size", "10", "--json", "--set", "model.n_layer=3")
    assert json.loads(sized.out)["parameters"] == text["parameters"]


def test_info_on_a_path_that_is_not_there_says_what_it_looked_for(fails, tmp_path):
    fails("info", tmp_path / "runs" / "tny",
          message=f"no such run dir, checkpoint, config or text: {tmp_path / 'runs' / 'tny'}")


def test_info_machine_says_what_a_run_would_decide_here_and_why(cli, monkeypatch):
    """`charlm info --machine`: the profile a run would make here (device, threads, dtype) and
    why, in the line a run says, as text or JSON; given with a target, one error."""
    import torch

    from charlm.runtime.profile import Machine

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(Machine, "cores", lambda self: 4)
    monkeypatch.setattr(Machine, "busy_elsewhere", lambda self: 1.2)
    monkeypatch.setattr(Machine, "bf16_unit", lambda self: "AMX")
    monkeypatch.setattr(Machine, "bf16_speedup", lambda self: 3.0)
    try:
        text = cli("info", "--machine")
        assert (text.code, text.out) == (0, (
            "profile: cpu, 3 threads (of 4 cores, other processes keep 1.2 busy), bfloat16 (AMX "
            "multiplies bf16 at 3.00x float32's speed here); a run records these in its "
            "config.yaml (train.threads, train.dtype pin them)\n"))
        as_json = json.loads(cli("info", "--machine", "--json").out)
        assert (as_json["device"], as_json["threads"], as_json["dtype"]) == ("cpu", 3, "bfloat16")
    finally:
        torch.set_num_threads(before)
    bad = cli("info", ROOT / "configs" / "tiny.yaml", "--machine")
    assert (bad.code, bad.err) == (2, "error: --machine describes this machine, not a run or "
                                      "config; give it alone (or with --json)\n")


def test_info_reads_text_from_stdin_and_a_quoted_glob_as_train_does(cli, tmp_path, monkeypatch):
    """`charlm info -` and `charlm info 'DIR/*.txt'` were "no such run dir, checkpoint, config
    or text", though info takes what `charlm train` takes."""
    (tmp_path / "a.txt").write_text("abc\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("xyz\n", encoding="utf-8")
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"hello\n")))
    piped = cli("info", "-", "--json")
    assert piped.code == 0, piped.err
    assert json.loads(piped.out)["vocab_size"] == len(set("hello\n"))
    globbed = cli("info", tmp_path / "*.txt", "--json")
    assert globbed.code == 0, globbed.err
    assert json.loads(globbed.out)["vocab_size"] == len(set("abc\nxyz\n"))
    assert cli("info", tmp_path / "nope.txt").err == (
        f"error: no such run dir, checkpoint, config or text: {tmp_path / 'nope.txt'}\n")
