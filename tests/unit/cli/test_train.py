"""Bad input through the CLI: one `error: ...` line on stderr, exit code 2, no traceback, and
every file that existed before is left as it was. (`charlm sample` cases live in test_cli.py.)"""

from __future__ import annotations

import errno
import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from charlm.data.text import prepare as prepare_dataset
from charlm.training import checkpoint
from tests.helpers import TINY, write


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


def test_directory_where_a_text_file_is_expected(fails, tmp_path):
    (tmp_path / "texts").mkdir()
    fails("prepare", tmp_path / "texts", "--out", tmp_path / "ds",
          message=f"input is a directory, not a text file: {tmp_path / 'texts'}")


def test_a_pipe_is_refused_as_an_input_to_prepare(fails, tmp_path):
    """`charlm prepare <(cmd)` read the pipe's text in pass 1 and nothing in pass 2: exit 0 with
    empty train.bin/val.bin under a meta.json that counted the characters (and a named pipe
    blocked); `charlm train --data <(cmd)` said the input was empty."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"hello world, hello world")
    os.close(write_end)
    pipe = f"/proc/self/fd/{read_end}"
    message = (f"input is not a regular file (a pipe or a device): {pipe}; charlm reads its "
               "text twice, save it to a file first")
    try:
        fails("prepare", pipe, "--out", tmp_path / "ds", message=message)
        fails("train", TINY, "--data", pipe, "--out", tmp_path / "run", message=message)
    finally:
        os.close(read_end)
    fails("prepare", "/dev/null", "--out", tmp_path / "ds",
          message=message.replace(pipe, "/dev/null"))


def test_directory_that_is_not_a_dataset(fails, tmp_path):
    (tmp_path / "texts").mkdir()
    fails("train", TINY, "--data", tmp_path / "texts", "--out", tmp_path / "run",
          message=f"{tmp_path / 'texts'} is not a prepared dataset (no meta.json); give a text "
                  "file or run `charlm prepare` first")


def test_empty_file(fails, tmp_path):
    empty = write(tmp_path / "empty.txt", "")
    fails("train", TINY, "--data", empty, "--out", tmp_path / "run",
          message=f"input file is empty: {empty}; give it some text to learn from")


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


@pytest.mark.parametrize("content, byte, offset", [
    ("café".encode("latin-1") + b" au lait", 0xE9, 3),  # Latin-1 text
    (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), 0x80, 136),  # a binary
])
def test_file_that_is_not_utf8(fails, tmp_path, content, byte, offset):
    bad = write(tmp_path / "bad.txt", content)
    fails("train", TINY, "--data", bad, "--out", tmp_path / "run",
          message=f"{bad} is not valid UTF-8 text (invalid byte 0x{byte:02x} at byte offset "
                  f"{offset}); charlm reads text files as UTF-8, convert it first")


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


def test_integer_too_large_for_64_bits(fails):
    fails("info", TINY, "--vocab-size", "65", "--set", "model.block_size=99999999999999999999",
          message=f"invalid value for model.block_size in {TINY} with --set overrides: "
                  "99999999999999999999 is too large")


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


@pytest.fixture
def trained(cli, tmp_path, corpus) -> Path:
    """A run of 20 steps in tmp_path/run (checkpoints at steps 10 and 20)."""
    run = tmp_path / "run"
    result = cli("train", TINY, "--data", corpus, "--out", run, "--set", "train.max_iters=20",
                 "--set", "train.eval_interval=10")
    assert result.code == 0, result.err
    return run


def test_resume_when_last_pt_is_a_directory_does_not_say_no_checkpoint(fails, trained):
    """A fresh start in that run dir says to --resume; --resume must not send the user back."""
    (trained / "last.pt").unlink()
    (trained / "last.pt").mkdir()
    fails("train", "--out", trained, "--resume",
          message=f"--resume: {trained / 'last.pt'} is a directory, not a checkpoint; move it "
                  "out of the way, or start over with --overwrite")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_resume_when_last_pt_is_a_fifo_does_not_say_no_checkpoint(fails, trained):
    (trained / "last.pt").unlink()
    os.mkfifo(trained / "last.pt")
    fails("train", "--out", trained, "--resume",
          message=f"cannot load checkpoint {trained / 'last.pt'}: not a regular file (a "
                  "directory, FIFO or device); give a .pt file that charlm train wrote")


def test_resume_from_a_checkpoint_with_a_float_step_is_one_error_line(fails, trained):
    state = checkpoint.load(trained / "last.pt")
    state["train_state"]["step"] = 20.5
    torch.save(state, trained / "last.pt")
    fails("train", "--out", trained, "--resume", "--set", "train.max_iters=22",
          message=f"checkpoint {trained / 'last.pt'} is damaged or incomplete: train_state is "
                  "missing or malformed")


def test_resume_with_a_conflicting_architecture(fails, trained):
    fails("train", "--out", trained, "--resume", "--set", "model.n_embd=64",
          message=f"--resume: model.n_embd=64 conflicts with the checkpoint's 32 in "
                  f"{trained / 'last.pt'}; the architecture of a run cannot change (drop the "
                  "override, or start a new run with another --out)")


def test_resume_with_max_iters_below_the_step_reached(fails, trained):
    fails("train", "--out", trained, "--resume", "--set", "train.max_iters=10",
          message=f"--resume: train.max_iters=10 is below the step the run has reached (20, "
                  f"{trained / 'last.pt'}); give at least 20")


def test_resume_with_other_data_leaves_the_run_and_its_dataset_cache_alone(fails, trained,
                                                                            tmp_path):
    """Text with another vocabulary is refused before the run's prepared dataset cache would
    be rebuilt from it (`fails` checks every file under tmp_path, the cache included)."""
    other = write(tmp_path / "other.txt", "xyz zyx\n" * 500)
    fails("train", other, "--out", trained, "--resume",
          message=f"--resume: the vocabulary of {other} differs from the run's checkpoint; "
                  "resume with the data the run was started on")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda(fails, tmp_path, corpus):
    fails("train", TINY, "--data", corpus, "--out", tmp_path / "run", "--set",
          "train.device=cuda",
          message="train.device is 'cuda' but no CUDA GPU is available to this torch build; "
                  "use --set train.device=cpu (or auto), or install a CUDA build of torch")
    fails("train", TINY, "--data", corpus, "--out", tmp_path / "run", "--device", "cuda",
          message="--device is 'cuda' but no CUDA GPU is available to this torch build; use "
                  "--device cpu (or auto), or install a CUDA build of torch")


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


def test_prepare_and_export_out_that_cannot_be_written(fails, tmp_path, corpus, trained):
    """The error names the --out the user gave, not a temporary file beside it."""
    blocker = write(tmp_path / "file", "a regular file")
    fails("prepare", corpus, "--out", blocker / "ds",
          message=f"cannot write to dataset dir {blocker / 'ds'}: Not a directory; choose "
                  "another --out")
    fails("export", trained, "--out", blocker / "a" / "b",
          message=f"cannot write to --out {blocker / 'a' / 'b'}: Not a directory; choose "
                  "another --out")


def test_a_failed_first_checkpoint_does_not_advise_resume(cli, tmp_path, corpus, monkeypatch):
    """The first write of last.pt failing said "continue with --resume", which has nothing to
    resume from."""
    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith("last.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    run = tmp_path / "run"
    result = cli("train", TINY, "--data", corpus, "--out", run, "--set", "train.max_iters=10",
                 "--set", "train.eval_interval=10")
    assert (result.code, result.err) == (
        2, f"error: cannot write checkpoint {run / 'last.pt'}: No space left on device; the "
           "previous last.pt, if any, is unchanged; free disk space (or fix the run dir), then "
           "start the run again with --overwrite (it has no last.pt to resume from yet)\n")


def test_resume_after_the_text_moved_points_to_the_runs_copy(cli, fails, trained, corpus):
    """It said "input file not found" though RUN/dataset held the prepared text."""
    corpus.rename(corpus.with_suffix(".moved"))
    cache = trained / "dataset"
    fails("train", "--out", trained, "--resume", "--set", "train.max_iters=30",
          message=f"--resume: input file not found: {corpus} (data.path), but the run's prepared "
                  f"copy is in {cache}; resume with --data {cache}")
    result = cli("train", "--out", trained, "--resume", "--data", cache, "--set",
                 "train.max_iters=30")
    assert result.code == 0, result.err


def test_disk_full_during_a_save_keeps_the_previous_checkpoints(cli, trained, monkeypatch):
    real_fsync, calls = os.fsync, []

    def fsync_then_disk_full(fd):  # the disk fills up with a checkpoint's data
        real_fsync(fd)
        if ".pt.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
            calls.append(fd)
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync_then_disk_full)
    before = {name: (trained / name).read_bytes() for name in ("last.pt", "best.pt")}
    # The resume rewrites config.yaml and appends to metrics.jsonl, as it should.
    result = cli("train", "--out", trained, "--resume", "--set", "train.max_iters=40")
    assert (result.code, result.err) == (
        2, f"error: cannot write checkpoint {trained / 'best.pt'}: No space left on device; the "
           "previous best.pt, if any, is unchanged; free disk space (or fix the run dir), then "
           "continue with --resume\n")  # step 30 improved: best.pt is written before last.pt
    assert len(calls) == 1
    assert {name: (trained / name).read_bytes() for name in before} == before
    assert not [p.name for p in trained.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize("damage, detail", [
    (lambda s: s.pop("train_state"), "train_state is missing or malformed"),
    (lambda s: s.update(train_state={"step": "x"}), "train_state is missing or malformed"),
    (lambda s: s["train_state"].update(bad_streak="x"), "train_state is missing or malformed"),
    (lambda s: s.pop("config"), "no config"),
    (lambda s: s.update(config="model"), "config is not a mapping with a model section"),
    (lambda s: s["model"].pop("wte.weight"), "Error(s) in loading state_dict for GPT: Missing "
                                              "key(s) in state_dict: \"wte.weight\"."),
])
def test_damaged_checkpoint_gives_one_error_line(fails, trained, damage, detail):
    for name in ("last.pt", "best.pt"):
        state = torch.load(trained / name, weights_only=True)
        damage(state)
        torch.save(state, trained / name)
    for args in (["sample", trained], ["info", trained], ["eval", trained, TINY],
                 ["train", "--out", trained, "--resume", "--set", "train.max_iters=30"]):
        ckpt = trained / ("last.pt" if args[0] == "train" else "best.pt")
        result = fails(*args, message=f"checkpoint {ckpt} is damaged or incomplete: {detail}")
        assert result.out == ""


def test_checkpoint_or_export_with_an_empty_vocabulary_gives_one_error_line(cli, fails, trained,
                                                                           tmp_path):
    """Not torch's warnings about zero-element tensors, then a size mismatch."""
    export = tmp_path / "exported"
    assert cli("export", trained, "--out", export).code == 0
    write(export / "vocab.json", "[]")
    state = torch.load(trained / "best.pt", weights_only=True)
    state["vocab"] = []
    torch.save(state, trained / "best.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fails("sample", trained, message=f"checkpoint {trained / 'best.pt'} is damaged or "
                                         "incomplete: a vocabulary must hold at least one "
                                         "character")
        fails("eval", export, TINY, message=f"cannot load exported model {export}: a vocabulary "
                                            "must hold at least one character")


def test_checkpoint_whose_vocabulary_holds_a_surrogate_gives_one_error_line(cli, fails, trained,
                                                                          tmp_path):
    """`sample`, `sample --json` and `export --format hf` failed printing it
    (UnicodeEncodeError)."""
    state = torch.load(trained / "best.pt", weights_only=True)
    state["vocab"] = sorted(state["vocab"][:-1] + ["\udc80"])
    torch.save(state, trained / "best.pt")
    message = (f"checkpoint {trained / 'best.pt'} is damaged or incomplete: a vocabulary must "
               "not hold a surrogate (U+D800..U+DFFF)")
    fails("sample", trained, message=message)
    fails("sample", trained, "--json", message=message)
    fails("export", trained, "--format", "hf", "--out", tmp_path / "hf", message=message)


@pytest.mark.parametrize("key, value, detail", [
    ("n_layer", 1000000, "model.n_layer=1000000 but the weights hold 2 blocks"),
    ("n_embd", 64, "wte.weight has shape (58, 32) in the weights but (58, 64) in the config"),
])
def test_a_config_that_disagrees_with_its_weights_is_refused_before_building(
        cli, fails, trained, tmp_path, key, value, detail):
    """A 358 KB best.pt (or an export's config.json) saying n_layer: 1000000 made `sample`
    and `info` allocate until the machine ran out: the model was built before its config was
    checked against the stored tensors."""
    export = tmp_path / "exported"
    assert cli("export", trained, "--out", export).code == 0
    meta = json.loads((export / "config.json").read_text())
    meta["config"]["model"][key] = value
    write(export / "config.json", json.dumps(meta))
    state = torch.load(trained / "best.pt", weights_only=True)
    state["config"]["model"][key] = value
    torch.save(state, trained / "best.pt")
    fails("sample", trained, message=f"checkpoint {trained / 'best.pt'} is damaged or "
                                     f"incomplete: {detail}")
    fails("info", trained, message=f"checkpoint {trained / 'best.pt'} is damaged or "
                                   f"incomplete: {detail}")
    fails("sample", export, message=f"cannot load exported model {export}: {detail}")


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


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["sample", "eval"])
def test_sample_and_eval_without_cuda_name_their_own_option(fails, tmp_path, corpus, command):
    run = tmp_path / "run"
    run.mkdir()
    extra = [corpus] if command == "eval" else []
    fails(command, run, *extra, "--device", "cuda",
          message="--device is 'cuda' but no CUDA GPU is available to this torch build; use "
                  "--device cpu (or auto), or install a CUDA build of torch")


def test_prompt_file_that_is_a_directory(fails, tmp_path):
    fails("sample", tmp_path, "--prompt-file", tmp_path,
          message=f"prompt file {tmp_path} is a directory; give a text file")


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
