"""`charlm train` and `train()`: the loss falls and the run dir is complete, every architecture
option trains, resumes and samples, the warnings a run gives, evals stacked into fewer forwards,
bf16 and compiled runs against float32."""

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch
import yaml

from charlm.config.loading import load_config
from charlm.config.sampling import SampleConfig
from charlm.config.schema import RunConfig
from charlm.data.batches import BatchSampler
from charlm.data.chunks import sha256_file
from charlm.data.datasets import dataset_for
from charlm.data.pairs import PairVocab
from charlm.data.prepare import prepare
from charlm.export import save_safetensors
from charlm.generation.decoding import generate
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT
from charlm.runtime.precision import grad_scaler
from charlm.training import checkpoint
from charlm.training import loop as train_module
from charlm.training import run_objects as run_module
from charlm.training.evaluation import evaluate
from charlm.training.loop import train, train_step
from charlm.training.optimizer import make_optimizer
from charlm.training.schedule import Schedule
from charlm.training.tasks import TextTask
from tests.helpers import (
    ROOT,
    SHAKESPEARE,
    TINY,
    VARIANTS,
    reversal_pairs,
    seq2seq_config,
    with_,
    write_pairs,
)


def test_tiny_config_loss_falls_and_run_dir_is_complete(tiny_cfg):
    # a preview sample of 16 characters, not 200, at each eval: the preview runs, faster
    tiny_cfg = with_(tiny_cfg, train={"sample_chars": 16})
    state = train(tiny_cfg)
    run = tiny_cfg.train.out_dir
    lines = Path(run, "metrics.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    evals = [e for e in events if e["event"] == "eval"]
    trains = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in evals] == [20, 40, 60]
    assert [e["step"] for e in trains] == [10, 20, 30, 40, 50, 60]
    for e in events:
        assert {"step", "elapsed_s", "tokens", "lr", "train_loss"} <= set(e)
    for e in evals:
        assert e["val_bpc"] == pytest.approx(e["val_loss"] / math.log(2))
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] < math.log(65)
    assert trains[-1]["tokens"] == 60 * 16 * 16
    assert state.step == 60 and state.best_val == min(e["val_loss"] for e in evals)
    for name in ("config.yaml", "last.pt", "best.pt", "dataset/meta.json"):
        assert Path(run, name).is_file(), name
    assert any(p.name.startswith("events.out.tfevents") for p in Path(run, "tb").iterdir())
    last = checkpoint.load(f"{run}/last.pt")
    assert last["train_state"]["step"] == 60
    # the checkpoint holds the config as run: `auto` threads as the profile resolved them
    assert RunConfig.from_dict(last["config"]) == with_(tiny_cfg, train={
        "threads": torch.get_num_threads()})


def test_tiny_model_overfits_a_short_string(tmp_path):
    text = "to be or not to be, that is the question. "
    src = tmp_path / "short.txt"
    src.write_text(text * 60)
    cfg = RunConfig.from_dict({
        "model": {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 48},
        "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_iters": 10, "weight_decay": 0.0},
        "train": {"max_iters": 150, "batch_size": 16, "eval_interval": 50, "eval_iters": 2,
                  "sample_chars": 0, "device": "cpu", "out_dir": str(tmp_path / "run")},
        "data": {"path": str(src)},
    })
    state = train(cfg)
    assert state.best_val < 0.1
    model, vocab, _, _ = checkpoint.load_model(tmp_path / "run")
    prompt = torch.tensor([vocab.encode("to be or ")])
    steps = generate(model, prompt, 60, SampleConfig(temperature=0))
    out = vocab.decode(torch.cat(list(steps)).tolist())
    assert ("to be or " + out).startswith((text * 3)[:69])


def test_val_fraction_that_a_prepared_dataset_ignores_is_warned_about(tiny_cfg, tmp_path,
                                                                     capsys):
    data = tmp_path / "ds"
    prepare([tiny_cfg.data.path], data, 0.05, progress=False)
    # 0.1, the default, is taken for "not set": no warning about a split the user never chose
    for fraction, out in ((0.05, "same"), (0.1, "default"), (0.25, "other")):
        train(with_(tiny_cfg, data={"path": str(data), "val_fraction": fraction},
                    train={"max_iters": 6, "out_dir": str(tmp_path / out), "sample_chars": 0}),
              progress=False)
        warnings = [line for line in capsys.readouterr().err.splitlines()
                    if line.startswith("warning:")]
        assert warnings == ([] if fraction != 0.25 else [
            f"warning: data.val_fraction=0.25 does not apply to the prepared dataset {data}, "
            "whose split was made with --val-fraction 0.05; run `charlm prepare` again to change "
            "it"])


def test_a_resume_onto_another_validation_split_is_warned_about_once(tiny_cfg, capsys):
    """Resuming with another data.val_fraction, or with changed text of the same characters,
    compared val losses (and kept best.pt) across different validation sets without a word."""
    run = Path(tiny_cfg.train.out_dir)
    short = {"eval_interval": 1, "eval_iters": 1, "sample_chars": 0}

    def resume(max_iters: int, **data) -> list[str]:
        best = checkpoint.load(run / "last.pt")["train_state"]["best_val"]
        train(with_(tiny_cfg, data=data, optim={"warmup_iters": 0},
                    train={"max_iters": max_iters, **short}), resume=True, progress=False)
        return [line.replace(f"{best:.4f}", "BEST") for line in capsys.readouterr().err
                .splitlines() if line.startswith("warning:")]

    train(with_(tiny_cfg, optim={"warmup_iters": 0}, train={"max_iters": 1, **short}),
          progress=False)
    assert resume(2) == []  # the same split
    assert resume(3, val_fraction=0.2) == [
        "warning: --resume: the validation split changed (data.val_fraction 0.1 -> 0.2): val "
        "losses from here on are not comparable with the run's best BEST so far, and best.pt is "
        "replaced only by an eval whose val loss is below it"]
    assert resume(4, val_fraction=0.2) == []  # said once: the run's split is now 0.2's
    corpus = Path(tiny_cfg.data.path)
    corpus.write_text(corpus.read_text(encoding="utf-8")[::-1], encoding="utf-8")
    assert resume(5, val_fraction=0.2) == [
        f"warning: --resume: the validation split may have changed ({corpus} is not the text "
        "the run's dataset cache was made from): val losses from here on may not be comparable "
        "with the run's best BEST so far, and best.pt is replaced only by an eval whose val "
        "loss is below it"]


def test_a_warmup_as_long_as_the_run_is_warned_about(tiny_cfg, tmp_path, capsys):
    """The learning rate would only ramp up (a trial run with few steps, often): say so, once."""
    for max_iters, out in ((5, "five"), (6, "six")):  # tiny.yaml: warmup_iters 5
        train(with_(tiny_cfg, train={"max_iters": max_iters, "eval_interval": max_iters,
                                     "out_dir": str(tmp_path / out), "sample_chars": 0}),
              progress=False)
        warnings = [line for line in capsys.readouterr().err.splitlines()
                    if line.startswith("warning:")]
        assert warnings == ([] if max_iters == 6 else [
            "warning: optim.warmup_iters=5 is not below train.max_iters=5: the learning rate "
            "never reaches optim.lr=0.01; lower optim.warmup_iters to train at full rate"])


def test_train_scores_evals_with_the_stacked_batches_eagerly(tiny_cfg, monkeypatch):
    """When evals stack batches (on CUDA), train() scores them with the uncompiled model (the
    compiled graph has the training batch's shape), at the grouping eval_batches_per_forward
    chose, and logs the same losses as one batch a forward. A stand-in for torch.compile's
    wrapper tells the two models apart."""
    cfg = with_(tiny_cfg, train={"max_iters": 20, "eval_interval": 10, "compile": True,
                                 "sample_chars": 0})

    class Compiled(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, *args):
            return self.inner(*args)

    monkeypatch.setattr(run_module, "compile_model", lambda model, *a: (Compiled(model), None))
    seen = []
    real_evaluate = train_module.evaluate

    def spy(model, *args, **kwargs):
        seen.append((type(model).__name__, args[-1]))
        return real_evaluate(model, *args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate", spy)
    train(cfg)
    ungrouped = read_evals(cfg)
    monkeypatch.setattr(run_module, "eval_batches_per_forward", lambda *a: 3)
    train(cfg, overwrite=True)
    assert seen == [("Compiled", 1)] * 2 + [("GPT", 3)] * 2
    for a, b in zip(ungrouped, read_evals(cfg), strict=True):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)


def read_evals(cfg: RunConfig) -> list[dict]:
    lines = Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "eval"]


@pytest.mark.parametrize("path", ["bfloat16", "compile"])
def test_bfloat16_and_compiled_training_follow_the_float32_loss_curve(path, tiny_cfg, tmp_path,
                                                                      capsys):
    """20 steps from one seed, bf16 autocast or torch.compile (float32) against eager float32:
    the logged train losses (every 5 steps) and the evals (steps 10, 20) agree. Compiled float32
    differs only in the order of float ops; bf16 rounds every matmul input to 8 bits of
    mantissa."""
    def curve(name: str, **train_keys) -> list[float]:
        cfg = with_(tiny_cfg, optim={"lr": 3e-3, "min_lr": 3e-4},  # no loss spikes
                    train={"max_iters": 20, "eval_interval": 10, "log_interval": 5,
                           "sample_chars": 0, "out_dir": str(tmp_path / name), **train_keys})
        train(cfg)
        events = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
        return [e.get("val_loss", e["train_loss"]) for e in events]

    fp32 = curve("fp32", dtype="float32")
    if path == "compile":
        from torch._dynamo.utils import counters
        counters.clear()
        other = curve("compiled", dtype="float32", compile=True)
        assert "warning:" not in capsys.readouterr().err  # compiled for real, no fallback
        # two graphs, training's (built by the compile probe) and the evals' (no grad): the
        # batches' strides once differed from the probe's, and training compiled a third
        assert counters["stats"]["unique_graphs"] == 2
        assert other == pytest.approx(fp32, abs=1e-4)
    else:
        other = curve("bf16", dtype="bfloat16")
        assert other == pytest.approx(fp32, abs=0.02)
    assert len(other) == 6 and other[-1] < 3.6 < math.log(65)  # it learned


def test_compile_that_fails_to_build_falls_back_with_one_warning(tiny_cfg, monkeypatch, capsys):
    def broken_compile(model):
        def run(*args, **kwargs):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore detail")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    cfg = with_(tiny_cfg, train={"compile": True, "max_iters": 6, "eval_interval": 6,
                                 "sample_chars": 0})
    state = train(cfg)
    captured = capsys.readouterr()
    out = captured.err
    assert state.step == 6
    assert "warning:" not in captured.out
    assert out.count("warning:") == 1
    assert ("warning: torch.compile failed (RuntimeError: InvalidCxxCompiler: No working C++ "
            "compiler found); training without compile") in out
    eager = train(with_(cfg, train={"compile": False, "out_dir": f"{tiny_cfg.train.out_dir}2"}))
    assert eager.best_val == state.best_val  # the failed probe changed nothing


def test_checkpoint_interval_sets_last_and_best_follows_evals(tiny_cfg, monkeypatch):
    cfg = with_(tiny_cfg, train={"max_iters": 25, "eval_interval": 10, "checkpoint_interval": 4,
                                 "sample_chars": 0})
    writes: list[tuple[str, int]] = []
    real_save = checkpoint.save

    def record(state, path):
        writes.append((Path(path).name, state["train_state"]["step"]))
        real_save(state, path)

    monkeypatch.setattr(checkpoint, "save", record)
    train(cfg)
    assert [s for name, s in writes if name == "last.pt"] == [4, 8, 12, 16, 20, 24, 25]
    lines = Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()
    evals = [json.loads(line) for line in lines]
    evals = [e for e in evals if e["event"] == "eval"]
    improved = [e["step"] for e in evals if e["best_val_loss"] == e["val_loss"]]
    assert [s for name, s in writes if name == "best.pt"] == improved and improved[0] == 10


@pytest.mark.parametrize("checkpoint_interval", [None, 8])
def test_tokens_per_s_counts_training_time_only(checkpoint_interval, tiny_cfg, monkeypatch):
    """On a fake clock where a step takes 1 s and an eval 100 s, tokens/s is one step's tokens
    whatever the evals and saves between two log lines (it was doubled when a save reset the
    clock but not the step count, and took the eval's time when an eval saved nothing)."""
    cfg = with_(tiny_cfg, train={"max_iters": 8, "log_interval": 4, "eval_interval": 2,
                                 "checkpoint_interval": checkpoint_interval, "sample_chars": 0})
    clock = [0.0]
    real_step, real_eval = train_module.train_step, train_module.evaluate

    def step(*args):
        clock[0] += 1.0
        return real_step(*args)

    def evaluate_slowly(*args, **kwargs):
        clock[0] += 100.0
        return real_eval(*args, **kwargs)

    monkeypatch.setattr(train_module, "train_step", step)
    monkeypatch.setattr(train_module, "evaluate", evaluate_slowly)
    train(cfg, now=lambda: clock[0])
    lines = Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    rates = [(e["step"], e["tokens_per_s"]) for e in logged if e["event"] == "train"]
    assert rates == [(4, 16 * 16), (8, 16 * 16)]


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_learns_on_the_tiny_config(variant, tiny_cfg, tmp_path):
    cfg = with_(tiny_cfg, model=VARIANTS[variant], train={"max_iters": 60, "eval_iters": 2})
    dev, fp32 = torch.device("cpu"), torch.float32
    data = dataset_for(cfg.data.path, cfg.data.val_fraction, tmp_path / "ds")
    model = GPT(cfg.model, len(data.vocab))
    optimizer = make_optimizer(model, cfg.optim)
    sampler = BatchSampler(data.train, cfg.model.block_size, cfg.train.batch_size, dev, 0)
    before = evaluate(model, TextTask(cfg, data), dev, fp32)["val"]
    schedule = Schedule(cfg.optim, cfg.train)
    for step in range(cfg.train.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr(step)
        train_step(model, optimizer, grad_scaler(dev, fp32), sampler, cfg, dev, fp32)
    after = evaluate(model, TextTask(cfg, data), dev, fp32)["val"]
    assert after < before - 0.7, (before, after)


def test_train_command_and_refusal_to_clobber(cli, tmp_path, corpus):
    run = tmp_path / "run"
    args = ["train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run,
            "--set", "train.max_iters=20", "--set", "train.sample_chars=0"]
    result = cli(*args)
    assert result.code == 0, result.err
    assert "step 20: train" in result.out and f"checkpoints in {run}" in result.out
    assert load_config(run / "config.yaml").train.max_iters == 20
    before = (run / "last.pt").read_bytes()
    again = cli(*args)
    assert again.code == 2
    assert again.err.startswith(
        f"error: {run} already holds a run (last.pt, best.pt, metrics.jsonl, tb, config.yaml)")
    assert (run / "last.pt").read_bytes() == before
    # min_lr 5e-3 is legal under the run's lr (tiny.yaml: 1e-2), not under the default 4e-3.
    resumed = cli("train", "--out", run, "--resume", "--set", "train.max_iters=30",
                  "--set", "optim.min_lr=5e-3")
    assert resumed.code == 0, resumed.err
    assert "done: 30 steps" in resumed.out
    assert load_config(run / "config.yaml").optim.min_lr == 5e-3
    # the closing line: the whole run's time (resumes included) and its rates
    done = re.search(r"^done: 30 steps in ([\d.]+)s \(([\d.]+) steps/s, ([\d,]+) tok/s\), "
                     r"best val loss \d\.\d{4}, checkpoints in ", resumed.out, re.M)
    assert done, resumed.out
    seconds = checkpoint.load(run / "last.pt")["train_state"]["elapsed_s"]
    assert float(done[1]) == round(seconds, 1) and float(done[2]) == round(30 / seconds, 1)


def test_every_option_changed_trains_resumes_and_samples(cli, tmp_path, corpus):
    run = tmp_path / "run"
    arch = [f"model.{k}={v}" for k, v in VARIANTS["all_changed"].items()]
    sets = [a for kv in arch for a in ("--set", kv)]
    first = cli("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run, *sets,
                "--set", "train.max_iters=10", "--set", "train.eval_interval=5",
                "--set", "train.sample_chars=0")
    assert first.code == 0, first.err
    resumed = cli("train", "--out", run, "--resume", "--set", "train.max_iters=15")
    assert resumed.code == 0 and "done: 15 steps" in resumed.out
    conflict = cli("train", "--out", run, "--resume", "--set", "model.norm=layernorm")
    assert conflict.code == 2 and "model.norm='layernorm' conflicts" in conflict.err
    args = ["sample", run, "--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "11"]
    cached, uncached = cli(*args), cli(*args, "--no-cache")
    assert cached.code == 0 and cached.out == uncached.out
    info = json.loads(cli("info", run, "--json").out)
    assert info["config"]["model"]["pos_encoding"] == "rope"
    assert info["checkpoint"]["step"] == 15
    assert not info["parameters"]["tied"]


def test_train_without_a_config_names_the_run_dir_after_the_data(cli, tmp_path, monkeypatch):
    """`charlm train --data my.txt` trains into runs/my, as `charlm train my.txt` does, not into
    the built-in default's run dir; --out or --set train.out_dir still choose."""
    monkeypatch.chdir(tmp_path)
    for name in ("mine.txt", "other.txt"):
        Path(name).write_text(SHAKESPEARE.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    small = ["--set", "train.max_iters=1", "--set", "train.eval_iters=1", "--set",
             "model.n_layer=1", "--set", "train.sample_chars=0"]
    for args, run in ((["--data", "mine.txt"], "runs/mine"), (["other.txt"], "runs/other"),
                      (["--data", "mine.txt", "--set", "train.out_dir=elsewhere"], "elsewhere")):
        result = cli("train", *args, *small)
        assert result.code == 0, result.err
        assert result.out.rstrip().endswith(f"checkpoints in {run}")
        assert Path(run, "last.pt").is_file()
    assert sorted(p.name for p in Path("runs").iterdir()) == ["mine", "other"]


@pytest.mark.parametrize("unit, speedup, dtype, line", [
    ("AVX512_BF16", 4.1, "auto", "bfloat16 (AVX512_BF16 multiplies bf16 at 4.10x float32's "
     "speed here)"),
    ("AVX512_BF16", 0.56, "auto", "float32 (AVX512_BF16 multiplies bf16 at 0.56x float32's "
     "speed here)"),
    (None, 4.1, "auto", "float32 (this CPU emulates bf16)"),
    ("AMX", 4.1, "float32", "float32 (train.dtype)"),
])
def test_train_decides_what_it_computes_with_once_and_a_resume_keeps_it(
        cli, tmp_path, corpus, monkeypatch, unit, speedup, dtype, line):
    """`dtype: auto` is bf16 on one CPU and float32 on the next, even among CPUs with a bf16
    unit: a run decides before its first step, says which and why once, and records it in
    config.yaml; a resume on a machine that would decide otherwise computes as recorded."""
    from charlm.runtime.profile import Machine

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(Machine, "bf16_unit", lambda self: unit)
    monkeypatch.setattr(Machine, "bf16_speedup", lambda self: speedup)
    run = tmp_path / "run"
    fresh = cli("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run,
                "--set", "train.max_iters=2", "--set", "optim.warmup_iters=1",
                "--set", f"train.dtype={dtype}", "--set", "train.eval_interval=2",
                "--set", "train.sample_chars=0")
    assert fresh.code == 0, fresh.err
    decided = line.split(" ")[0]
    saved = yaml.safe_load((run / "config.yaml").read_text())["train"]
    assert (saved["threads"], saved["dtype"]) == (1, decided)
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(Machine, "bf16_unit", lambda self: "AMX")  # another machine
    monkeypatch.setattr(Machine, "bf16_speedup", lambda self: 1.0 / speedup)
    resumed = cli("train", "--out", run, "--resume", "--set", "train.max_iters=4")
    assert resumed.code == 0, resumed.err
    recorded = f"{decided} (train.dtype)"
    for result, threads, what in ((fresh, "OMP_NUM_THREADS", line),
                                  (resumed, "train.threads", recorded)):
        lines = result.out.splitlines()
        expected = (f"profile: cpu, 1 thread ({threads}), {what}; recorded in config.yaml "
                    "(train.threads, train.dtype pin them)")
        assert lines[0] == expected and lines.count(expected) == 1
        assert lines[1].startswith("step 2: train " if result is fresh else "step 4: train ")


def test_keep_checkpoints_keeps_the_newest_steps_and_sample_step_loads_one(cli, corpus, tmp_path,
                                                                           monkeypatch):
    """train.keep_checkpoints=2 over saves at steps 10, 20, 30 and 40 keeps step 30's and 40's
    beside best.pt and last.pt; `sample RUN --step 30` is that checkpoint's sample; a step that
    is not kept is one error listing those that are; a write that fails leaves them as they were
    and no partial file."""
    import errno
    import os

    run = tmp_path / "run"
    common = ["--data", corpus, "--out", run, "--set", "train.keep_checkpoints=2",
              "--set", "train.eval_interval=10", "--set", "train.sample_chars=0"]
    assert cli("train", ROOT / "configs" / "tiny.yaml", *common,
               "--set", "train.max_iters=40").code == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step-000030.pt", "step-000040.pt"]
    assert {"best.pt", "last.pt"} <= {p.name for p in run.iterdir()}
    assert checkpoint.load(run / "checkpoints" / "step-000030.pt")["train_state"]["step"] == 30
    args = ["--max-new-tokens", "100", "--seed", "3", "--json"]

    def tokens(target, *step):
        result = cli("sample", target, *step, *args)
        assert result.code == 0, result.err
        return [json.loads(line)["text"] for line in result.out.splitlines()]

    by_step = tokens(run, "--step", "30")
    assert by_step == tokens(run / "checkpoints" / "step-000030.pt") != tokens(run / "last.pt")
    missing = cli("sample", run, "--step", "20")
    assert (missing.code, missing.out, missing.err) == (
        2, "", f"error: --step 20: {run} keeps no checkpoint of step 20; its checkpoints/ holds "
               "steps 30, 40\n")

    kept = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    real_fsync = os.fsync

    def disk_full_in_a_step_file(fd):
        real_fsync(fd)
        if "/checkpoints/.step-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full_in_a_step_file)
    result = cli("train", ROOT / "configs" / "tiny.yaml", *common, "--resume",
                 "--set", "train.max_iters=50")
    assert (result.code, result.err.splitlines()[-1]) == (
        2, f"error: cannot write checkpoint {run / 'checkpoints' / 'step-000050.pt'}: No space "
           "left on device; the previous step-000050.pt, if any, is unchanged; free disk space "
           "(or fix the run dir), then continue with --resume")
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == kept


def sentences(words: str, n: int, seed: int) -> str:
    """`n` lines of one grammar ("the cat saw a dog.") over `words` (nouns | verbs)."""
    rng = random.Random(seed)
    nouns, verbs = (part.split() for part in words.split("|"))
    return "".join(f"{rng.choice(['the', 'a'])} {rng.choice(nouns)} {rng.choice(verbs)} "
                   f"{rng.choice(['the', 'a'])} {rng.choice(nouns)}.\n" for _ in range(n))


def test_fine_tuning_beats_training_from_scratch_for_the_same_steps(cli, tmp_path):
    """A tiny model trained on text A and fine-tuned on text B (the same grammar over other
    words, one with a character A lacks) reaches a lower val loss on B in 30 steps than the
    same model trained from scratch on B for 30 steps. The run names its parent, and a resume
    needs the parent no more."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(sentences("cat dog bird fish | saw met fed chased", 1500, 1), encoding="utf-8")
    b.write_text(sentences("cow fox hen café | saw met hid helped", 1500, 2), encoding="utf-8")
    assert cli("train", TINY, "--data", a, "--out", tmp_path / "a",
               "--set", "train.max_iters=100", "--set", "train.eval_interval=100",
               "--set", "train.sample_chars=0").code == 0
    parent = tmp_path / "parent.pt"
    (tmp_path / "a" / "best.pt").rename(parent)
    losses = {}
    for name, extra in (("scratch", []), ("tuned", ["--init-from", parent])):
        result = cli("train", TINY, "--data", b, "--out", tmp_path / name,
                     "--set", "train.max_iters=30", "--set", "train.sample_chars=0", *extra)
        assert result.code == 0, result.err
        losses[name] = float(re.search(r"best val loss ([0-9.]+)", result.out).group(1))
    assert losses["tuned"] < losses["scratch"] - 0.2, (
        f"val loss on B after 30 steps: fine-tuned {losses['tuned']:.4f}, from scratch "
        f"{losses['scratch']:.4f}")
    tuned, sha = tmp_path / "tuned", sha256_file(parent)
    saved = load_config(tuned / "config.yaml").train
    assert (saved.init_from, saved.init_from_sha256) == (str(parent), sha)
    info = cli("info", tuned).out
    assert f"init_from: {parent}\n" in info and f"init_from_sha256: {sha}\n" in info
    old = checkpoint.load(parent)["vocab"]
    parent.unlink()  # a resume continues from last.pt, never from the parent
    assert cli("train", "--out", tuned, "--resume", "--set", "train.max_iters=32").code == 0
    assert checkpoint.load(tuned / "last.pt")["vocab"] == old + ["l", "n", "p", "x", "é"]


def test_an_encoder_decoder_fine_tunes_from_its_safetensors_export(cli, tmp_path):
    """Source and target vocabularies both grow: old units keep their ids, new ones follow."""
    vocab = PairVocab(tuple("gfedcbz"), tuple("gfedcbzyx"), "space")
    cfg = RunConfig(model=seq2seq_config())
    model = EncoderDecoder(cfg.model, vocab.source_size, vocab.target_size, vocab.src_pad)
    save_safetensors(model, vocab, cfg, tmp_path / "export")
    data = write_pairs(tmp_path / "rev.tsv", reversal_pairs(60, 1))
    result = cli("train", data, "--out", tmp_path / "run", "--init-from", tmp_path / "export",
                 "--set", "data.target_units=space", "--set", "data.val_fraction=0.2",
                 "--set", "train.max_iters=2", "--set", "train.batch_size=8",
                 "--set", "train.eval_iters=1", "--set", "train.eval_pairs=2",
                 "--set", "train.device=cpu", "--set", "train.dtype=float32")
    assert result.code == 0, result.err
    assert checkpoint.load(tmp_path / "run" / "last.pt")["vocab"] == {
        "source": list("gfedcbza"), "target": list("gfedcbzyxa"), "target_units": "space"}


MULTI_SCRIPT = ("The quick brown fox jumps over the lazy dog. Ça va, Zoë?\n"
                "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον σκύλο.\n"
                "敏捷的棕色狐狸跳过了懒狗。日本語も少し。\n"
                "Emoji: 🦊🐕🙂👍 and more 🦊!\n")


def test_a_byte_model_trains_samples_and_round_trips_multi_script_text(cli, tmp_path):
    """data.units=byte on Latin, Greek, CJK and emoji: the vocabulary is the bytes that occur,
    text round-trips through the ids, samples (the CLI's stream, and the API's) are whole
    UTF-8 characters without a replacement character, and eval reports bits per byte."""
    import charlm

    src = tmp_path / "multi.txt"
    src.write_text(MULTI_SCRIPT * 30, encoding="utf-8")
    run = tmp_path / "run"
    result = cli("train", TINY, "--data", src, "--out", run, "--set", "data.units=byte",
                 "--set", "train.max_iters=12", "--set", "train.eval_interval=6",
                 "--set", "train.sample_chars=40")
    assert result.code == 0, result.err
    lm = charlm.load(run)
    raw = MULTI_SCRIPT.encode()
    assert (lm.vocab.units, lm.vocab.chars) == ("byte", [chr(b) for b in sorted(set(raw))])
    assert lm.vocab.decode(lm.vocab.encode(MULTI_SCRIPT)) == MULTI_SCRIPT
    out = cli("sample", run, "--prompt", "Η γρ", "--max-new-tokens", "120", "--num-samples",
              "2", "--seed", "1")
    assert out.code == 0 and "\ufffd" not in out.out and out.out.count("Η γρ") == 2, out
    for sample in charlm.sample(lm, "🦊", max_new_tokens=100, num_samples=3, seed=2):
        assert "\ufffd" not in sample.text
        assert len(sample.text.encode("utf-8", "strict")) >= sample.tokens - 3
    scored = cli("eval", run, src)
    assert scored.code == 0 and " bits/byte, " in scored.out, scored


def test_byte_units_for_pairs_is_one_error(fails, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("abc\tcba\nde\ted\n" * 20, encoding="utf-8")
    fails("train", TINY, "--data", pairs, "--out", tmp_path / "run", "--set",
          "model.arch=encoder_decoder", "--set", "data.units=byte",
          message=f"data.units=byte is for text and a GPT, but {pairs} is trained as pairs by "
                  "an encoder-decoder, whose vocabularies are characters; set data.units=char")


def test_a_normal_form_trains_and_takes_prompts_and_eval_text_in_it(cli, tmp_path):
    """data.unicode_normalize NFC on an NFD text: the model's é is one character, and an NFD
    prompt and eval text (which it would otherwise refuse as unknown) are taken in NFC."""
    import unicodedata

    nfd = unicodedata.normalize("NFD", "le café et la crème brûlée, déjà vu.\n" * 200)
    text = tmp_path / "nfd.txt"
    text.write_text(nfd, encoding="utf-8")
    run = tmp_path / "run"
    assert cli("train", TINY, "--data", text, "--out", run, "--set", "train.max_iters=2",
               "--set", "data.unicode_normalize=NFC", "--set", "train.sample_chars=0").code == 0
    vocab = checkpoint.load(run / "last.pt")["vocab"]
    assert vocab["normalize"] == "NFC" and "é" in vocab["chars"] and "\u0301" not in vocab["chars"]
    sampled = cli("sample", run, "--prompt", unicodedata.normalize("NFD", "café"),
                  "--max-new-tokens", "5")
    assert (sampled.code, sampled.out[:4]) == (0, "café")
    assert cli("eval", run, text).code == 0


def test_train_on_a_glob_and_a_file_resumes_and_takes_a_folders_val_fraction(cli, tmp_path,
                                                                            monkeypatch):
    """`charlm train 'src/**/*.py' README.md` crashed at its first checks (data.path a list,
    read as one path); --resume finds the same inputs; a val fraction for a folder is no
    prepared dataset's, so no warning says it does not apply."""
    text = (ROOT / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "a.py").write_text(text[:6000])
    (tmp_path / "src" / "pkg" / "b.py").write_text(text[6000:12000])
    (tmp_path / "README.md").write_text(text[12000:15000])
    monkeypatch.chdir(tmp_path)
    common = [TINY, "src/**/*.py", "README.md", "--out", "run", "--set",
              "data.val_fraction=0.2", "--set", "optim.warmup_iters=1",
              "--set", "train.sample_chars=0"]
    first = cli("train", *common, "--set", "train.max_iters=2")
    assert first.code == 0 and "warning" not in first.err, first.err
    meta = json.loads((tmp_path / "run" / "dataset" / "meta.json").read_text())
    assert [s["path"] for s in meta["sources"]] == ["src/a.py", "src/pkg/b.py", "README.md"]
    resumed = cli("train", *common, "--resume", "--set", "train.max_iters=4")
    assert resumed.code == 0 and "warning" not in resumed.err, resumed.err
    assert checkpoint.load(tmp_path / "run" / "last.pt")["train_state"]["step"] == 4
