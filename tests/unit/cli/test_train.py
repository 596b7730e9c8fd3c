"""`charlm train` up to its first step (charlm.cli.train): the config it builds from
CONFIG_OR_TEXT, --data, --out and --set, and bad input as one `error: ...` line on stderr with
exit code 2, no traceback, every file that existed before left as it was."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from charlm.api import load
from charlm.cli.train import train_config
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.prepare import prepare as prepare_dataset
from charlm.training import checkpoint
from charlm.training.run_dir import RUN_FILES
from tests.helpers import (
    ROOT,
    TINY,
    fixed_memory,
    flip_bytes,
    no_step,
    random_export,
    reversal_pairs,
    write,
    write_pairs,
)


def test_missing_data_file(fails, tmp_path):
    fails("train", TINY, "--data", tmp_path / "none.txt", "--out", tmp_path / "run",
          message=f"input file not found: {tmp_path / 'none.txt'}")


def test_missing_text_file_leaves_no_run_dir(fails, tmp_path, monkeypatch):
    """`charlm train` on a mistyped file name fails without leaving runs/NAME behind."""
    monkeypatch.chdir(tmp_path)
    fails("train", "mytxt.txt", message="input file not found: mytxt.txt")
    # Without data on the command line, where data.path came from and what to do instead.
    fails("train", message="input file not found: data/tinyshakespeare.txt (data.path of the "
          "built-in defaults, taken from the current directory); give your text as `charlm "
          "train my.txt` or --data PATH")
    fails("train", TINY, message="input file not found: data/tinyshakespeare.txt (data.path of "
          f"{TINY}, taken from the current directory); give your text as `charlm train my.txt` "
          "or --data PATH")
    fails("train", TINY, "--data", "my.txt", "--out", "runs/a/b",
          message="input file not found: my.txt")
    # --set data.path is the user's own path, as --data is: not the defaults' or the CONFIG's
    fails("train", "--set", "data.path=my.txt", message="input file not found: my.txt")
    fails("train", TINY, "-s", "data.path = my.txt", message="input file not found: my.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_missing_config_file(fails, tmp_path):
    missing = tmp_path / "none.yaml"
    fails("train", missing, message=f"config file not found: {missing}")


def test_directory_that_is_not_a_dataset(fails, tmp_path):
    (tmp_path / "texts").mkdir()
    fails("train", TINY, "--data", tmp_path / "texts", "--out", tmp_path / "run",
          message=f"{tmp_path / 'texts'} holds no files; give a folder or pattern with text "
                  "files in it")


def test_empty_file(fails, tmp_path):
    empty = write(tmp_path / "empty.txt", "")
    fails("train", TINY, "--data", empty, "--out", tmp_path / "run",
          message=f"input file is empty: {empty}; give it some text to learn from, or pass "
                  "--skip-invalid (data.skip_invalid) to skip such files")


def test_single_distinct_character(fails, tmp_path):
    same = write(tmp_path / "same.txt", "a" * 500)
    fails("train", TINY, "--data", same, "--out", tmp_path / "run",
          message=f"{same} holds only one distinct character ('a'); a language model needs at "
                  "least two, give it real text")


def test_text_too_short_for_a_training_window(fails, tmp_path):
    short = write(tmp_path / "short.txt", "abcdefghij")  # 9 train characters, block 16
    fails("train", TINY, "--data", short, "--out", tmp_path / "run", new=True,
          message=f"the train split of {short} is too short: 9 characters, but one window "
                  "needs block_size + 1 = 17; give more text, or lower model.block_size")


def test_text_too_short_for_a_validation_window(fails, tmp_path):
    text = write(tmp_path / "t.txt", "abcdefghij" * 10)  # 90 train, 10 val characters
    fails("train", TINY, "--data", text, "--out", tmp_path / "run", new=True,
          message=f"the val split of {text} is too short: 10 characters, but one window needs "
                  "block_size + 1 = 17; give more text, or lower model.block_size or raise "
                  "data.val_fraction")


def test_prepared_dataset_too_short_for_a_validation_window(fails, tmp_path):
    # The split of a prepared dir is fixed: data.val_fraction does not apply to it.
    text = write(tmp_path / "t.txt", "abcdefghij" * 10)
    prepare_dataset([text], tmp_path / "ds", 0.1)
    fails("train", TINY, "--data", tmp_path / "ds", "--out", tmp_path / "run", new=True,
          message=f"the val split of {tmp_path / 'ds'} is too short: 10 characters, but one "
                  "window needs block_size + 1 = 17; give more text, or lower model.block_size "
                  "or prepare it again with a larger --val-fraction")


@pytest.mark.parametrize("content, why, hint", [
    ("café".encode("latin-1") + b" au lait", "invalid byte 0xe9 at byte offset 3",
     "charlm reads text files as UTF-8, convert it first"),  # Latin-1 text
    (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "a NUL byte at byte offset 7",
     "a binary file? charlm reads UTF-8 text files"),
    (b"\x1f\x8b\x08\x00" + bytes(20), "invalid byte 0x8b at byte offset 1",
     "it looks gzip-compressed: name it *.gz and charlm decompresses it"),
])
def test_file_that_is_not_utf8(fails, tmp_path, content, why, hint):
    """A gzip file was "not valid UTF-8 (invalid byte 0x8b)"; a binary one, an invalid byte far
    after the NUL bytes that make it binary."""
    bad = write(tmp_path / "bad.txt", content)
    fails("train", TINY, "--data", bad, "--out", tmp_path / "run",
          message=f"{bad} is not valid UTF-8 text ({why}); {hint}, or pass --skip-invalid "
                  "(data.skip_invalid) to skip such files")


def test_yaml_syntax_error_names_line_and_column(fails, tmp_path):
    bad = write(tmp_path / "bad.yaml", "model:\n  n_layer: 2\n  n_head: [4, 8\ntrain:\n")
    fails("train", bad, message=f"YAML syntax error in {bad} at line 4, column 6: expected ',' "
                                "or ']', but got ':'")


def test_yaml_that_is_not_a_mapping(fails, tmp_path):
    bad = write(tmp_path / "list.yaml", "- model\n- train\n")
    fails("train", bad, message=f"{bad} must hold a mapping of sections (model, optim, train, "
                                "data), got list")


def test_unknown_section_with_suggestion(fails, tmp_path):
    bad = write(tmp_path / "typo.yaml", "modle:\n  n_layer: 2\n")
    fails("train", bad, message=f"unknown section 'modle' in {bad}, did you mean 'model'?")


def test_unknown_key_with_suggestion(fails):
    fails("train", TINY, "--set", "optim.lrate=1e-3",
          message=f"unknown key 'optim.lrate' in {TINY} with --set overrides, did you mean 'lr'?")


def test_wrong_value_type(fails):
    fails("train", TINY, "--set", "train.max_iters=many",
          message=f"invalid value for train.max_iters in {TINY} with --set overrides: 'many', "
                  "expected an integer")


@pytest.mark.parametrize("override, message", [
    ("optim.lr=-0.1", "invalid config value optim.lr: -0.1 must be > 0"),
    ("model.n_head=3", "invalid config value model.n_embd: 32 is not divisible by "
                       "model.n_head=3; choose n_embd as a multiple of n_head"),
    ("train.checkpoint_interval=0", "invalid config value train.checkpoint_interval: must be "
                                    ">= 1, or null to write last.pt at every eval"),
    ("train.max_bad_steps=0", "invalid config value train.max_bad_steps: must be >= 1"),
    ("train.sample_chars=-1", "invalid config value train.sample_chars: must be >= 0 (0 turns "
                              "samples off)"),
    # tiny.yaml: warmup 5, lr 1e-2 (a decay ending inside the warmup would skip the cosine)
    ("optim.lr_decay_iters=5", "invalid config value optim.lr_decay_iters: must be more than "
                               "optim.warmup_iters (5), or null"),
    ("optim.min_lr=0.5", "invalid config value optim.min_lr: 0.5 must be in [0, lr], and lr is "
                         "0.01; set optim.min_lr to at most lr, e.g. lr / 10 = 0.001"),
])
def test_impossible_values(fails, override, message):
    fails("train", TINY, "--set", override, message=message)


def test_set_without_equals(fails):
    fails("train", TINY, "--set", "optim.lr",
          message="--set expects section.key=value, got 'optim.lr' (e.g. --set optim.lr=1e-3)")


@pytest.mark.parametrize("option, key", [("--out", "train.out_dir"), ("--data", "data.path"),
                                         ("--device", "train.device")])
def test_option_and_set_of_the_same_key(fails, tmp_path, option, key):
    """--out / --data / --device beat a --set of their key silently before."""
    value = {"--out": tmp_path / "a", "--data": TINY, "--device": "cpu"}[option]
    fails("train", TINY, option, value, "--set", f"{key}=x",
          message=f"{option} and --set {key} set the same key; give one of them")


def test_text_file_and_set_data_path(fails, tmp_path):
    text = write(tmp_path / "my.txt", "hello world\n")
    fails("train", text, "--set", f"data.path={text}",
          message=f"{text} and --set data.path set the same key; give one of them")


def test_resume_without_a_checkpoint(fails, tmp_path):
    fails("train", "--out", tmp_path / "run", "--resume",
          message=f"--resume: no checkpoint {tmp_path / 'run' / 'last.pt'}; start the run "
                  "without --resume")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda(fails, tmp_path, corpus):
    fails("train", TINY, "--data", corpus, "--out", tmp_path / "run", "--set",
          "train.device=cuda",
          message="train.device is 'cuda' but no CUDA GPU is available to this torch build; "
                  "use cpu (or auto), or install a CUDA build of torch")
    fails("train", TINY, "--data", corpus, "--out", tmp_path / "run", "--device", "cuda",
          message="--device is 'cuda' but no CUDA GPU is available to this torch build; use "
                  "cpu (or auto), or install a CUDA build of torch")


def test_a_model_too_big_for_memory_is_refused_before_it_is_built(fails, tmp_path, corpus):
    """A mistyped n_layer would build modules for hours, then be killed for memory."""
    dataset = tmp_path / "ds"
    prepare_dataset([corpus], dataset)
    L, C, T, V = 10**9, 32, 16, len(set(corpus.read_text(encoding="utf-8")))  # tiny.yaml's
    # a layer: q, k, v, o and the MLP's 4C up and down, two LayerNorm weights (no biases); then
    # the token embedding (tied to the head), learned positions, the final LayerNorm
    params = L * (12 * C * C + 2 * C) + V * C + T * C + C
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    fails("train", TINY, "--data", dataset, "--out", tmp_path / "run", "--set",
          f"model.n_layer={L}",
          message=f"the model has {params:,} parameters, whose weights, gradients and AdamW "
                  f"state need {16 * params / 2**30:,.1f} GiB, more than the {memory:,.1f} GiB of "
                  "cpu; make model.n_layer or model.n_embd smaller")


def test_out_dir_that_cannot_be_written(fails, tmp_path, corpus):
    blocker = write(tmp_path / "file", "a regular file")  # root ignores chmod; ENOTDIR does not
    fails("train", TINY, "--data", corpus, "--out", blocker / "run",
          message=f"cannot write to run dir {blocker / 'run'}: Not a directory; choose another "
                  "--out")


def test_dataset_whose_meta_json_is_not_an_object(fails, tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    write(ds / "meta.json", "[1, 2]")
    fails("train", TINY, "--data", ds, "--out", tmp_path / "run", new=True,
          message=f"cannot read dataset {ds}: not a charlm dataset; prepare it again with "
                  "`charlm prepare`")


def test_dataset_with_ids_outside_its_vocabulary(cli, fails, tmp_path, corpus):
    """A hand-edited meta.json whose vocabulary lost a symbol the ids still use (the id width
    unchanged) is caught when the dataset loads, not as an IndexError mid-forward."""
    import json

    ds = tmp_path / "ds"
    assert cli("prepare", corpus, "--out", ds).code == 0
    meta = json.loads((ds / "meta.json").read_text(encoding="utf-8"))
    meta["vocab"] = meta["vocab"][:-1]
    meta["vocab_size"] -= 1
    write(ds / "meta.json", json.dumps(meta))
    n = len(meta["vocab"])
    fails("train", TINY, "--data", ds, "--out", tmp_path / "run", new=True,
          message=f"cannot read dataset {ds}: train.bin holds ids outside the {n}-symbol "
                  "vocabulary of meta.json; prepare it again with `charlm prepare`")


@pytest.mark.parametrize("key, value, detail", [
    ("vocab_size", 10, "meta.json gives vocab_size 10, but its vocab holds 58 characters"),
    ("dtype", "uint16", "meta.json gives dtype 'uint16', but a 58-symbol vocabulary has uint8 ids"),
])
def test_dataset_whose_meta_json_contradicts_its_vocab(cli, fails, tmp_path, corpus, key, value,
                                                       detail):
    """A meta.json whose vocab_size or dtype was edited was read as if they were not there."""
    import json

    ds = tmp_path / "ds"
    assert cli("prepare", corpus, "--out", ds).code == 0
    meta = json.loads((ds / "meta.json").read_text(encoding="utf-8"))
    assert len(meta["vocab"]) == 58
    write(ds / "meta.json", json.dumps({**meta, key: value}))
    fails("train", TINY, "--data", ds, "--out", tmp_path / "run", new=True,
          message=f"cannot read dataset {ds}: {detail}; prepare it again with `charlm prepare`")


def test_a_batch_too_big_for_memory_is_an_error_line(fails, tmp_path, corpus, monkeypatch):
    """Where the device's memory is unknown (MPS), the guard of tests/test_memory.py cannot
    refuse the batch first: the allocator's failure is the error line."""
    monkeypatch.setattr("charlm.runtime.device.memory_bytes", lambda device: None)
    # 10^12 rows: their window starts alone are 8 TB, which the CPU allocator refuses
    fails("train", TINY, "--data", corpus, "--out", tmp_path / "run", "--set",
          "train.batch_size=1000000000000",
          message="out of memory (tried to allocate 8000000000000 bytes): make the model "
                  "(model.n_layer, model.n_embd), train.batch_size or model.block_size smaller",
          new=True)  # the prepared dataset cache


def test_cuda_out_of_memory_is_an_error_line(cli, monkeypatch, tmp_path, corpus):
    import charlm.training.loop

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
                                     "a total capacity of 79.11 GiB of which 1.5 GiB is free.")

    monkeypatch.setattr(charlm.training.loop, "train_step", oom)
    result = cli("train", TINY, "--data", corpus, "--out", tmp_path / "run")
    assert (result.code, result.err) == (2, "error: out of memory (tried to allocate 2.00 GiB): "
                                            "make the model (model.n_layer, model.n_embd), "
                                            "train.batch_size or model.block_size smaller\n")


def test_other_runtime_errors_are_not_dressed_up_as_input_errors(cli, monkeypatch, tmp_path,
                                                                 corpus):
    import charlm.training.loop

    def bug(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(charlm.training.loop, "train_step", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        cli("train", TINY, "--data", corpus, "--out", tmp_path / "run")


def test_time_option_sets_the_budget(cli, tmp_path, corpus):
    r = cli("train", "--data", corpus, "--out", tmp_path / "r", "--time", "5 min")
    assert (r.code, r.err.splitlines()) == (2, [
        "error: invalid config value train.max_time: '5 min' is not a duration; give seconds or "
        "a number with s, m or h (90, 30s, 5m, 2h, 1h30m)"])
    r = cli("train", "--data", corpus, "--time", "5m", "--set", "train.max_time=60")
    assert (r.code, r.err.splitlines()) == (2, [
        "error: --time and --set train.max_time set the same key; give one of them"])


def test_bad_config_gives_one_error_line(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_embd: 30\n  n_head: 4\n")
    result = cli("train", bad)
    assert result.code == 2
    assert result.err == ("error: invalid config value model.n_embd: 30 is not divisible by "
                          "model.n_head=4; choose n_embd as a multiple of n_head\n")
    assert "Traceback" not in result.err


def test_train_on_missing_data_file(cli, tmp_path):
    result = cli("train", ROOT / "configs" / "tiny.yaml", "--data", tmp_path / "none.txt",
                 "--out", tmp_path / "run")
    assert (result.code, result.err) == (
        2, f"error: input file not found: {tmp_path / 'none.txt'}\n")


@pytest.fixture
def train_configs(monkeypatch) -> list:
    """The configs `charlm train` would train, in order; nothing is trained."""
    import charlm.training.loop

    seen = []
    monkeypatch.setattr(charlm.training.loop, "train", lambda cfg, **kw: seen.append(cfg) or
                        charlm.training.run_objects.TrainState())
    return seen


@pytest.mark.parametrize("name", ["my \U0001f600.txt", "caf\u00e9 \"x\": 1.txt", "123", "null"])
def test_train_takes_data_and_out_names_as_given(cli, tmp_path, monkeypatch, train_configs,
                                                 name):
    """--data, --out and a text file as CONFIG_OR_TEXT reach the config as the exact strings
    typed, whatever their characters (an emoji was read back as two lone surrogates, and the
    run died with a UnicodeEncodeError traceback)."""
    seen = train_configs
    monkeypatch.chdir(tmp_path)
    Path(name).write_text("some text\n", encoding="utf-8")
    for args, out in ((["--data", name, "--out", f"out {name}"], f"out {name}"),
                      ([name], str(Path("runs", Path(name).stem)))):
        result = cli("train", *args)
        assert result.code == 0, result.err
        assert (seen[-1].data.path, seen[-1].train.out_dir) == (name, out)


@pytest.mark.parametrize("name", ["MY.YAML", "my.Yml"])
def test_a_config_suffix_in_capitals_is_a_config(cli, tmp_path, corpus, train_configs, name):
    """`charlm train MY.YAML` reads the config, not the YAML text as the data to train on."""
    config = tmp_path / name
    config.write_text(f"model:\n  n_layer: 1\ndata:\n  path: {corpus}\n", encoding="utf-8")
    result = cli("train", config)
    assert result.code == 0, result.err
    assert (train_configs[-1].model.n_layer, train_configs[-1].data.path) == (1, str(corpus))
    info = cli("info", config, "--vocab-size", "10", "--json")
    assert info.code == 0, info.err
    assert json.loads(info.out)["config"]["model"]["n_layer"] == 1


@pytest.fixture
def text_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my.txt").write_text("hello\n", encoding="utf-8")
    return "my.txt"


def test_train_config_on_a_text_file(text_file, tmp_path):
    """`charlm train my.txt`: the defaults on my.txt, in runs/my unless --out or --set says."""
    cfg = train_config(Path(text_file))[0]
    assert (cfg.data.path, cfg.train.out_dir) == ("my.txt", str(Path("runs", "my")))
    assert RunConfig.from_dict({**cfg.to_dict(), "data": {}, "train": {}}) == RunConfig()
    assert train_config(None, data=text_file)[0].train.out_dir == str(Path("runs", "my"))
    assert train_config(text_file, out="o")[0].train.out_dir == "o"
    assert train_config(text_file, ["train.out_dir=s"])[0].train.out_dir == "s"
    assert train_config(text_file, device="cpu")[0].train.device == "cpu"
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  out_dir: r\n  max_iters: 3\n")
    cfg = train_config(config, ["train.max_iters=4"], data=text_file)[0]
    assert (cfg.data.path, cfg.train.out_dir, cfg.train.max_iters) == ("my.txt", "r", 4)


@pytest.mark.parametrize("args, kwargs, message", [
    (["my.txt"], {"data": "x.txt"}, "give the data either as my.txt or as --data, not both"),
    (["my.txt", ["data.path=x"]], {}, "my.txt and --set data.path set the same key; give one "
     "of them"),
    ([None, ["data.path=x"]], {"data": "my.txt"}, "--data and --set data.path set the same key; "
     "give one of them"),
    (["my.txt", [" train.out_dir =x"]], {"out": "o"}, "--out and --set train.out_dir set the "
     "same key; give one of them"),
    (["my.txt", ["train.device=cpu"]], {"device": "cpu"}, "--device and --set train.device set "
     "the same key; give one of them"),
    (["my.txt"], {"device": "gpu"}, "unknown device 'gpu'; use auto, cpu, cuda, cuda:N or mps"),
    ([None], {}, "input file not found: data/tinyshakespeare.txt (data.path of the built-in "
     "defaults, taken from the current directory); give your text as `charlm train my.txt` or "
     "--data PATH"),
])
def test_train_config_errors(text_file, args, kwargs, message):
    with pytest.raises(CharlmError) as e:
        train_config(*args, **kwargs)
    assert str(e.value) == message


def test_train_config_resume_finds_the_run_dir_before_applying_overrides(text_file,
                                                                        monkeypatch):
    """Without a CONFIG the overrides apply to the checkpoint's config: only the run dir is
    resolved here (an optim.min_lr above the defaults' lr must not fail before the resume)."""
    import charlm.training.resume

    calls = []

    def resume_config(run_dir, config, overrides):
        calls.append((run_dir, config, overrides))
        return RunConfig()

    monkeypatch.setattr(charlm.training.resume, "resume_config", resume_config)
    assert train_config(None, ["optim.min_lr=0.5", "train.out_dir=r"], resume=True) == (
        RunConfig(), None)
    assert calls == [(Path("r"), None, ["optim.min_lr=0.5", "train.out_dir=r"])]
    train_config(None, ["optim.min_lr=0.5"], out="o", resume=True)
    assert calls[-1] == (Path("o"), None, ["optim.min_lr=0.5", ("train.out_dir", "o")])
    train_config(text_file, ["optim.min_lr=0.5"], resume=True)  # `charlm train my.txt --resume`
    assert calls[-1] == (Path("runs", "my"), None, ["optim.min_lr=0.5", ("data.path", "my.txt")])
    train_config(None, resume=True)
    assert calls[-1] == (Path("runs", "tinyshakespeare"), None, [])


def test_a_batch_too_big_for_memory_is_one_error_line_before_the_first_step(
        cli, monkeypatch, tmp_path, corpus):
    """`--set train.batch_size=100000000` grew to 24 GB and was killed by the kernel (exit 137,
    no error line): only the weights were checked, not the batch's activations."""
    fixed_memory(monkeypatch, 24)
    no_step(monkeypatch)
    run = tmp_path / "run"
    t0 = time.perf_counter()
    result = cli("train", TINY, "--data", corpus, "--out", run, "--set",
                 "train.batch_size=100000000", "--set", "train.max_iters=3")
    assert time.perf_counter() - t0 < 5
    assert result.code == 2 and result.err.count("error:") == 1  # after a warmup warning
    assert result.err.endswith(
        "\nerror: a batch of 100,000,000 x 16 needs about 8,297.0 GiB for its activations in "
        "training (with the model's weights, gradients and AdamW state), more than the 24.0 GiB "
        "of cpu; lower train.batch_size (raising train.grad_accum keeps the tokens per step) or "
        "model.block_size\n")
    assert not [name for name in RUN_FILES if (run / name).exists()]  # nothing written


def test_model_arch_and_the_data_must_agree(cli, tmp_path, corpus):
    data = write_pairs(tmp_path / "reverse.tsv", reversal_pairs(50, 2))
    gpt = cli("train", ROOT / "configs" / "tiny.yaml", "--data", data, "--out", tmp_path / "a")
    assert gpt.err == (f"error: {data} holds pairs, but model.arch=decoder trains on text; set "
                       "model.arch=encoder_decoder, or data.format=text to train a GPT on its "
                       "lines\n")
    encdec = cli("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out",
                 tmp_path / "b", "--set", "model.arch=encoder_decoder")
    assert encdec.err.startswith("error: model.arch=encoder_decoder trains on pairs, but ")
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").glob("*.pt"))


def test_an_unknown_optimizer_is_one_error_line_naming_the_choices(fails):
    fails("train", TINY, "--set", "optim.name=sgd",
          message=f"invalid value for optim.name in {TINY} with --set overrides: 'sgd', "
                  "expected one of 'adamw', 'muon'")


def _checkpoint_of(export: Path, path: Path) -> Path:
    """A charlm checkpoint holding the model of `export`, as a run's best.pt would."""
    lm = load(export, device="cpu")
    checkpoint.save({"model": lm.model.state_dict(), "config": lm.config.to_dict(),
                     "vocab": lm.vocab.chars,
                     "train_state": {"step": 1, "best_val": 1.0, "tokens": 16}}, path)
    return path


@pytest.mark.parametrize("case", ["missing", "damaged", "text", "arch", "shape", "units",
                                  "resume", "twice"])
def test_a_bad_init_from_is_one_error_line_and_writes_nothing(fails, tmp_path, case):
    """--init-from a missing path, a damaged checkpoint, a file that is no model, a model of
    another architecture or units than the config asks, or with --resume: one line, exit 2, no
    run dir (`fails` checks that no file under tmp_path appears or changes; --set
    data.units=byte on a char parent wrote RUN/dataset, then advised preparing it again)."""
    text = write(tmp_path / "b.txt", "the quick brown fox\n" * 20)
    export = random_export(tmp_path / "export", "the quickbrownfx\n")
    args = ["train", text, "--out", tmp_path / "new", "--init-from"]
    if case == "missing":
        fails(*args, tmp_path / "nope",
              message=f"--init-from: no such run dir or checkpoint: {tmp_path / 'nope'}")
    elif case == "damaged":
        ckpt = _checkpoint_of(export, tmp_path / "best.pt")
        record = flip_bytes(ckpt, "data/0")
        fails(*args, ckpt, message=f"--init-from: checkpoint {ckpt} is damaged or incomplete: "
              f"record {record} fails its CRC-32 check (the file changed after it was saved); "
              "restore it from a backup, or use the run's other checkpoint (best.pt or "
              "last.pt)")
    elif case == "text":
        fails(*args, text, message=f"--init-from: cannot load checkpoint {text}: not a "
              "readable charlm checkpoint (not a complete torch.save file)")
    elif case in ("arch", "shape"):
        key, value, theirs = (("arch", "encoder_decoder", "decoder") if case == "arch"
                              else ("n_embd", 64, 32))
        fails(*args, export, "--set", f"model.{key}={value}",
              message=f"--init-from: model.{key}={value!r} conflicts with the parent's "
                      f"{theirs!r} in {export}; a fine-tuned model keeps its parent's "
                      f"architecture (drop model.{key} from the config and --set, or train "
                      "from scratch without --init-from)")
    elif case == "units":
        fails(*args, export, "--set", "data.units=byte",
              message=f"--init-from: data.units='byte' conflicts with the parent's 'char' in "
                      f"{export}; a fine-tuned model keeps its parent's units and normal form "
                      "(drop data.units from the config and --set, or train from scratch "
                      "without --init-from)")
    elif case == "resume":
        fails(*args, export, "--resume", message="--init-from starts a new run from a model's "
              "weights, --resume continues a run from its last.pt; give one of them")
    else:
        fails(*args, export, "--set", f"train.init_from={export}",
              message="--init-from and --set train.init_from set the same key; give one of "
                      "them")


def test_train_takes_several_inputs_as_one_data_path(text_file, tmp_path):
    """`charlm train a.txt b.txt` was a usage error with no hint; now both are the data, as a
    repeated --data is, and a YAML config may come first."""
    (tmp_path / "b.txt").write_text("more\n", encoding="utf-8")
    cfg = train_config([text_file, "b.txt"])[0]
    assert (cfg.data.path, cfg.data.inputs, cfg.train.out_dir) == (
        ("my.txt", "b.txt"), ["my.txt", "b.txt"], str(Path("runs", "my")))
    assert train_config(None, data=[text_file, "b.txt"])[0].data.path == ("my.txt", "b.txt")
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  max_iters: 3\n")
    cfg = train_config([config, "src/**/*.py"])[0]
    assert (cfg.data.path, cfg.train.out_dir, cfg.train.max_iters) == (
        "src/**/*.py", str(Path("runs", "src")), 3)
    assert train_config(["notes.txt.gz"])[0].train.out_dir == str(Path("runs", "notes"))
