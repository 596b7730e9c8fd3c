"""Bad input on a trained run: damaged checkpoints and exports, resumes that cannot go on, saves
that fail mid-run. Each ends in one `error: ...` line with exit code 2 and leaves the run's files
as they were (errors that need no trained run are tested in tests/unit/cli/)."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from charlm.training import checkpoint
from tests.helpers import ROOT, TINY, flip_bytes, write


@pytest.mark.parametrize("command", [["sample"], ["eval", ROOT / "configs" / "tiny.yaml"],
                                     ["train", "--out"]])
@pytest.mark.parametrize("device", ["tpu", "CPU"])
def test_sample_eval_and_train_reject_an_unknown_device(cli, tiny_run, command, device):
    """One message for every command (train used to name "--set overrides" for its --device)."""
    args = [ROOT / "configs" / "tiny.yaml", *command[1:], tiny_run] if command[0] == "train" \
        else [tiny_run, *command[1:]]
    result = cli(command[0], *args, "--device", device)
    assert (result.code, result.err, result.out) == (
        2, f"error: unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps\n", "")


EVAL_MEMORY = ("score a shorter text (split the file), free memory on the device, or score on "
               "another --device")


@pytest.mark.parametrize("command, module, function, advice", [
    ("sample", "charlm.generation.text", "sample_text",
     "use a smaller --num-samples or --beams, or free memory on the device"),
    ("eval", "charlm.evaluation.scoring", "score_file", EVAL_MEMORY),
])
def test_out_of_memory_outside_training_gives_that_command_s_advice(cli, monkeypatch, tiny_run,
                                                                    corpus, command, module,
                                                                    function, advice):
    """It said to shrink the model and train.batch_size, which sample and eval cannot."""
    import importlib

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    monkeypatch.setattr(importlib.import_module(module), function, oom)
    args = [command, tiny_run] + ([corpus] if command == "eval" else [])
    result = cli(*args)
    assert (result.code, result.err) == (
        2, f"error: out of memory (tried to allocate 2.00 GiB): {advice}\n")


def test_a_memory_error_while_scoring_is_an_out_of_memory_line(cli, monkeypatch, tiny_run,
                                                                corpus):
    """Python's MemoryError in `charlm eval` (once, a text larger than the memory, read
    whole) was a traceback."""
    import charlm.evaluation.scoring

    def too_large(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(charlm.evaluation.scoring, "score_file", too_large)
    result = cli("eval", tiny_run, corpus)
    assert (result.code, result.err) == (2, f"error: out of memory: {EVAL_MEMORY}\n")


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
                  "out of the way, then start over with --overwrite")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_resume_when_last_pt_is_a_fifo_does_not_say_no_checkpoint(fails, trained):
    (trained / "last.pt").unlink()
    os.mkfifo(trained / "last.pt")
    fails("train", "--out", trained, "--resume",
          message=f"cannot read checkpoint {trained / 'last.pt'}: not a regular file (a "
                  "directory, FIFO or device); give a regular file")


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
          message=f"--resume: nothing to train: {trained / 'last.pt'} is at step 20 and "
                  "train.max_iters is 10; to train on, resume with --set train.max_iters=N "
                  "(N above 20)")


def test_resume_with_other_data_leaves_the_run_and_its_dataset_cache_alone(fails, trained,
                                                                            tmp_path):
    """Text with another vocabulary is refused before the run's prepared dataset cache would
    be rebuilt from it (`fails` checks every file under tmp_path, the cache included)."""
    other = write(tmp_path / "other.txt", "xyz zyx\n" * 500)
    fails("train", other, "--out", trained, "--resume", "--set", "train.max_iters=30",
          message=f"--resume: the vocabulary of {other} differs from the run's checkpoint; "
                  "resume with the data the run was started on")


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
        if ".pt.tmp-" in (path := os.readlink(f"/proc/self/fd/{fd}")):
            calls.append(Path(path).name.split(".tmp-")[0].removeprefix("."))
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync_then_disk_full)
    before = {name: (trained / name).read_bytes() for name in ("last.pt", "best.pt")}
    # The resume rewrites config.yaml and appends to metrics.jsonl, as it should.
    result = cli("train", "--out", trained, "--resume", "--set", "train.max_iters=40")
    # step 30 writes best.pt before last.pt if its eval improved (that depends on the machine's
    # kernels), else last.pt alone: the first write fails and the run stops there
    assert len(calls) == 1 and calls[0] in ("best.pt", "last.pt")
    assert (result.code, result.err) == (
        2, f"error: cannot write checkpoint {trained / calls[0]}: No space left on device; the "
           f"previous {calls[0]}, if any, is unchanged; free disk space (or fix the run dir), then "
           "continue with --resume\n")
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


@pytest.fixture
def tiny_copy(tiny_run, tmp_path) -> Path:
    """A copy of the shared tiny run (checkpoints, config, dataset cache) that a test may damage."""
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


def _retype(kind: str) -> Callable[[Path], str]:
    """Replace one weight of a checkpoint by one of `kind`, as a crafted file could; returns the
    detail of the error."""
    def damage(path: Path) -> str:
        state = torch.load(path, weights_only=True)
        w = state["model"]["blocks.0.attn.qkv.weight"]
        state["model"]["blocks.0.attn.qkv.weight"] = {
            "int32": w.to(torch.int32), "bool": w > 0, "complex": w.to(torch.complex64),
            "nan": w * math.nan}[kind]
        torch.save(state, path)
        if kind == "nan":
            return ("blocks.0.attn.qkv.weight holds NaN or inf (the weights diverged); use an "
                    "earlier checkpoint, or train again with a lower optim.lr")
        return (f"blocks.0.attn.qkv.weight holds {state['model']['blocks.0.attn.qkv.weight'].dtype}"
                ", not floating-point weights; use weights that charlm saved")
    return damage


def _flip(path: Path) -> str:
    record = flip_bytes(path, "data/0")  # the first weight's bytes (wte.weight)
    return (f"record {record} fails its CRC-32 check (the file changed after it was saved); "
            "restore it from a backup, or use the run's other checkpoint (best.pt or last.pt)")


@pytest.mark.parametrize("damage", [_retype("int32"), _retype("bool"), _retype("complex"),
                                    _retype("nan"), _flip],
                         ids=["int32", "bool", "complex", "nan", "flipped-bytes"])
def test_weights_of_another_dtype_nan_or_changed_bytes_are_refused_by_every_loader(
        fails, tiny_copy, damage):
    """sample printed `ROMEOKKKK...`, eval a loss of 8e9 (or `loss nan`) with exit code 0, and
    --resume trained on the weights; two flipped bytes in a tensor passed all three."""
    details = {name: damage(tiny_copy / name) for name in ("best.pt", "last.pt")}
    for args in (["sample", tiny_copy], ["eval", tiny_copy, TINY],
                 ["train", "--out", tiny_copy, "--resume", "--set", "train.max_iters=70"]):
        name = "last.pt" if args[0] == "train" else "best.pt"
        result = fails(*args, message=f"checkpoint {tiny_copy / name} is damaged or incomplete: "
                                      f"{details[name]}")
        assert result.out == ""


def test_an_export_whose_header_says_int32_is_refused_by_sample_and_eval(cli, fails, tiny_copy,
                                                                         tmp_path):
    export = tmp_path / "exported"
    assert cli("export", tiny_copy, "--out", export).code == 0
    data = (export / "model.safetensors").read_bytes()
    size = int.from_bytes(data[:8], "little")
    header = data[8:8 + size].replace(b'"wte.weight":{"dtype":"F32"',  # as long as I32's
                                      b'"wte.weight":{"dtype":"I32"')
    (export / "model.safetensors").write_bytes(data[:8] + header + data[8 + size:])
    for args in (["sample", export], ["eval", export, TINY]):
        fails(*args, message=f"cannot load exported model {export}: wte.weight holds torch.int32, "
                             "not floating-point weights; use weights that charlm saved")
