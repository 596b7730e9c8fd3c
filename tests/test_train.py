import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from charlm import checkpoint
from charlm import train as train_module
from charlm.config import OptimConfig, RunConfig, SampleConfig, save_config
from charlm.data import BatchSampler, dataset_for, prepare
from charlm.device import grad_scaler, resolve_device, resolve_dtype
from charlm.errors import CharlmError
from charlm.evaluation import batches_that_fit, eval_batches_per_forward
from charlm.faults import Interrupted
from charlm.model import GPT
from charlm.optim import make_optimizer
from charlm.rundir import resume_config
from charlm.sampling import generate
from charlm.train import (
    evaluate,
    lr_at,
    train,
    train_step,
)

from .conftest import ROOT, VARIANTS


def with_(cfg: RunConfig, **sections) -> RunConfig:
    raw = cfg.to_dict()
    for section, values in sections.items():
        raw[section].update(values)
    return RunConfig.from_dict(raw)


def test_lr_schedule_boundaries():
    o = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_iters=10, lr_decay_iters=110)
    assert lr_at(0, o, 500) == pytest.approx(1e-3 * 1 / 11)
    assert lr_at(9, o, 500) == pytest.approx(1e-3 * 10 / 11)
    assert lr_at(10, o, 500) == pytest.approx(1e-3)  # cosine starts at the peak
    assert lr_at(60, o, 500) == pytest.approx(1e-4 + 0.5 * (1e-3 - 1e-4))  # halfway
    assert lr_at(110, o, 500) == pytest.approx(1e-4)
    assert lr_at(400, o, 500) == 1e-4
    # lr_decay_iters null means max_iters
    o2 = OptimConfig(lr=1e-3, min_lr=0.0, warmup_iters=0)
    assert lr_at(50, o2, 100) == pytest.approx(0.5e-3)
    assert lr_at(100, o2, 100) == 0.0


def test_tiny_config_loss_falls_and_run_dir_is_complete(tiny_cfg):
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
    assert RunConfig.from_dict(last["config"]) == tiny_cfg


def test_tiny_model_overfits_a_short_string(tmp_path):
    text = "to be or not to be, that is the question. "
    src = tmp_path / "short.txt"
    src.write_text(text * 60)
    cfg = RunConfig.from_dict({
        "model": {"block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 48},
        "optim": {"lr": 1e-2, "min_lr": 1e-3, "warmup_iters": 10, "weight_decay": 0.0},
        "train": {"max_iters": 150, "batch_size": 16, "eval_interval": 50, "eval_iters": 2,
                  "device": "cpu", "out_dir": str(tmp_path / "run")},
        "data": {"path": str(src)},
    })
    state = train(cfg)
    assert state.best_val < 0.1
    model, vocab, _, _ = checkpoint.load_model(tmp_path / "run")
    prompt = torch.tensor([vocab.encode("to be or ")])
    steps = generate(model, prompt, 60, SampleConfig(temperature=0))
    out = vocab.decode(torch.cat(list(steps)).tolist())
    assert ("to be or " + out).startswith((text * 3)[:69])


def test_resume_continues_exactly(tiny_cfg, tmp_path):
    base = with_(tiny_cfg, optim={"lr_decay_iters": 40}, train={"max_iters": 40,
                                                                 "eval_interval": 10})
    straight = with_(base, train={"out_dir": str(tmp_path / "straight")})
    train(straight)
    half = with_(base, train={"max_iters": 20, "out_dir": str(tmp_path / "split")})
    train(half)
    first = checkpoint.load(tmp_path / "split" / "last.pt")
    assert first["train_state"]["step"] == 20
    resumed = resume_config(tmp_path / "split", None, ["train.max_iters=40"])
    state = train(resumed, resume=True)
    assert state.step == 40
    a = checkpoint.load(tmp_path / "straight" / "last.pt")
    b = checkpoint.load(tmp_path / "split" / "last.pt")
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert a["train_state"] == {**b["train_state"], "elapsed_s": a["train_state"]["elapsed_s"]}
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(sa[k]["exp_avg_sq"], sb[k]["exp_avg_sq"]) for k in sa)
    assert b["train_state"]["best_val"] <= first["train_state"]["best_val"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resume_on_cuda_restores_the_run(tiny_cfg, tmp_path):
    """last.pt was loaded onto the GPU, and torch refuses RNG states that are not CPU tensors
    ("RNG state must be a torch.ByteTensor"): every resume on CUDA failed as a damaged
    checkpoint."""
    run = tmp_path / "run"
    train(with_(tiny_cfg, train={"device": "cuda", "max_iters": 20, "eval_interval": 10,
                                 "out_dir": str(run)}))
    state = train(resume_config(run, None, ["train.max_iters=30"]), resume=True)
    assert (state.step, state.tokens) == (30, 30 * 16 * 16)  # tiny.yaml: batch 16, block 16
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 30


def test_resume_trains_with_the_betas_and_weight_decay_of_its_config(tiny_cfg):
    """`--resume --set optim.weight_decay=...` is recorded in the run's config: the optimizer must
    use it too, not the values its saved state_dict carries."""
    cfg = with_(tiny_cfg, train={"max_iters": 2, "eval_interval": 2, "eval_iters": 1,
                                 "sample_chars": 0})
    train(cfg)
    run = Path(cfg.train.out_dir)
    changed = ["train.max_iters=3", "optim.weight_decay=0.0", "optim.beta1=0.5"]
    train(resume_config(run, None, changed), resume=True)
    last = checkpoint.load(run / "last.pt")
    assert last["config"]["optim"]["weight_decay"] == 0.0
    groups = last["optimizer"]["param_groups"]
    assert [(g["betas"], g["weight_decay"]) for g in groups] == [((0.5, 0.99), 0.0)] * 2


def test_resume_may_switch_to_and_from_float16_loss_scaling(tiny_cfg, monkeypatch):
    """A run trained without a GradScaler (float32 / bf16 save its empty state) resumed in
    float16 (another GPU, or --set train.dtype=float16) starts the scaler afresh, and back: it
    was refused as a damaged checkpoint. float16 is CUDA only, so an enabled CPU scaler stands
    in for it."""
    cfg = with_(tiny_cfg, train={"max_iters": 2, "eval_interval": 2, "eval_iters": 1,
                                 "sample_chars": 0, "dtype": "float32"})
    train(cfg)
    run = Path(cfg.train.out_dir)
    assert checkpoint.load(run / "last.pt")["scaler"] == {}
    with monkeypatch.context() as m:
        m.setattr(train_module, "grad_scaler",
                  lambda device, dtype: torch.amp.GradScaler("cpu", enabled=True))
        assert train(resume_config(run, None, ["train.max_iters=3"]), resume=True).step == 3
    assert checkpoint.load(run / "last.pt")["scaler"]["scale"] == 2.0**16
    assert train(resume_config(run, None, ["train.max_iters=4"]), resume=True).step == 4


def test_resume_refuses_architecture_change_and_missing_checkpoint(tiny_cfg, tmp_path):
    with pytest.raises(CharlmError, match="--resume: no checkpoint"):
        resume_config(tmp_path / "nothing", None, [])
    train(with_(tiny_cfg, train={"max_iters": 20}))
    run = tiny_cfg.train.out_dir
    with pytest.raises(CharlmError) as e:
        resume_config(Path(run), None, ["model.n_layer=3"])
    assert "--resume: model.n_layer=3 conflicts with the checkpoint's 2" in str(e.value)


def test_checkpoint_from_before_the_architecture_options_loads_and_resumes(tiny_cfg):
    """A checkpoint whose config has no pos_encoding/norm/... keys is the default GPT."""
    train(with_(tiny_cfg, train={"max_iters": 20}))
    last = Path(tiny_cfg.train.out_dir, "last.pt")
    state = checkpoint.load(last)
    new_keys = ("pos_encoding", "norm", "norm_placement", "activation")
    state["config"]["model"] = {k: v for k, v in state["config"]["model"].items()
                                if k not in new_keys}
    checkpoint.save({k: v for k, v in state.items() if k not in ("format", "version")}, last)
    model, _, cfg, _ = checkpoint.load_model(last)
    assert (cfg.model.pos_encoding, cfg.model.norm, cfg.model.activation) == (
        "learned", "layernorm", "gelu")
    assert torch.equal(model.wpe.weight, state["model"]["wpe.weight"])
    run = Path(tiny_cfg.train.out_dir)
    with pytest.raises(CharlmError, match="model.norm='rmsnorm' conflicts with the checkpoint's "
                                          "'layernorm'"):
        resume_config(run, None, ["model.norm=rmsnorm"])
    assert train(resume_config(run, None, ["train.max_iters=25"]), resume=True).step == 25


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


def test_existing_run_is_not_clobbered(tiny_cfg):
    cfg = with_(tiny_cfg, train={"max_iters": 20})
    train(cfg)
    last_pt = Path(cfg.train.out_dir, "last.pt")
    last = last_pt.read_bytes()
    with pytest.raises(CharlmError, match="already holds a run .* --resume, .* --overwrite"):
        train(cfg)
    assert last_pt.read_bytes() == last
    train(cfg, overwrite=True)  # explicit consent starts over


def test_a_second_train_into_a_run_dir_in_use_is_refused(tiny_cfg):
    """While one `charlm train` holds the run dir (here: this test holds its lock), another,
    fresh or --resume, is refused before it writes anything; the lock ends with its holder."""
    import fcntl

    cfg = with_(tiny_cfg, train={"max_iters": 10})
    train(cfg)
    run = Path(cfg.train.out_dir)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    holder = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for resume in (False, True):
            with pytest.raises(CharlmError) as e:
                train(with_(cfg, train={"max_iters": 20}), resume=resume)
            assert str(e.value) == (f"{run} is in use by another `charlm train`; wait for it to "
                                    "end, or choose another --out")
        assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    finally:
        os.close(holder)
    assert train(with_(cfg, train={"max_iters": 20}), resume=True).step == 20  # released


def test_run_lock_holds_the_run_dir_that_is_there(tmp_path, monkeypatch):
    """A run that fails early removes the empty run dir it made. Another run that opened that
    dir just before must not lock the removed directory and go on unlocked beside a third: it
    takes the lock on the directory at the path, made again."""
    import fcntl

    run = tmp_path / "runs" / "x"
    real_flock = fcntl.flock
    calls = []

    def flock_after_a_removal(fd, op):
        if not calls:  # between this run's open and its lock, another run removed the dir
            run.rmdir()
            run.mkdir()
        calls.append(fd)
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", flock_after_a_removal)
    with train_module.run_lock(run):
        monkeypatch.setattr(fcntl, "flock", real_flock)
        other = os.open(run, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(other)
    assert len(calls) == 2
    assert run.is_dir()  # made again by the other run: not this one's to remove


def test_run_stopped_before_its_first_checkpoint_is_not_clobbered(tiny_cfg):
    """A run dir with a config and metrics but no checkpoint yet (killed before its first save,
    or --out pointed at the wrong dir) is left alone too, with no --resume hint (there is
    nothing to resume from)."""
    run = Path(tiny_cfg.train.out_dir)
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("notes\n")
    (run / "metrics.jsonl").write_text('{"event": "train"}\n')
    with pytest.raises(CharlmError) as e:
        train(tiny_cfg)
    assert str(e.value) == (f"{run} already holds a run (metrics.jsonl, config.yaml); start over "
                            "with --overwrite, or choose another --out")
    assert (run / "config.yaml").read_text() == "notes\n"
    assert (run / "metrics.jsonl").read_text() == '{"event": "train"}\n'


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_grad_accum_steps_as_one_batch_and_clips_the_accumulated_gradient(clip, tiny_cfg):
    """4 micro-batches of 2 rows give the update of one batch of 8 (to float rounding); the
    returned norm is the accumulated gradient's before clipping, and AdamW's first moment after
    one step is (1 - beta1) times the gradient clipped to optim.grad_clip."""
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, 20, (8, 16), generator=gen) for _ in range(2))
    torch.manual_seed(1)
    reference = GPT(tiny_cfg.model, 20)
    reference(x, y)[1].backward()
    pre_clip = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in reference.parameters()]))
    dev = torch.device("cpu")
    results = []
    for accum in (1, 4):
        cfg = with_(tiny_cfg, train={"grad_accum": accum, "batch_size": 8 // accum},
                    optim={"grad_clip": clip})
        torch.manual_seed(1)
        model = GPT(cfg.model, 20)
        optimizer = make_optimizer(model, cfg.optim)
        batches = list(zip(x.chunk(accum), y.chunk(accum), strict=True))
        sampler = SimpleNamespace(batch=lambda b=batches: b.pop(0))
        loss, norm, ok = train_step(model, optimizer, grad_scaler(dev, torch.float32), sampler,
                                    cfg, dev, torch.float32)
        assert bool(ok) and not batches
        assert norm.item() == pytest.approx(pre_clip.item(), rel=1e-5)
        moment = torch.linalg.vector_norm(torch.stack(
            [s["exp_avg"].norm() for s in optimizer.state.values()]))
        expected = min(pre_clip.item(), clip) if clip else pre_clip.item()
        assert moment.item() == pytest.approx((1 - cfg.optim.beta1) * expected, rel=1e-5)
        results.append((loss.item(), [p.detach() for p in model.parameters()]))
    (loss_1, weights_1), (loss_4, weights_4) = results
    assert loss_4 == pytest.approx(loss_1, rel=1e-6)
    for a, b in zip(weights_1, weights_4, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_evaluate_is_pure_and_restores_train_mode(tiny_cfg, tmp_path):
    data = dataset_for(tiny_cfg.data.path, 0.1, tmp_path / "ds")
    model = GPT(tiny_cfg.model, len(data.vocab)).train()
    rng = torch.get_rng_state()
    dev = torch.device("cpu")
    a = evaluate(model, data, tiny_cfg, dev, resolve_dtype("float32", dev))
    b = evaluate(model, data, tiny_cfg, dev, resolve_dtype("float32", dev))
    assert a == b and model.training
    assert torch.equal(rng, torch.get_rng_state())


@pytest.mark.parametrize("per_forward", [2, 3, 4, 9])
def test_evaluate_stacks_batches_into_fewer_forwards_with_the_same_losses(per_forward, tiny_cfg,
                                                                          tmp_path):
    """Stacked eval batches (CUDA's fewer, larger forwards) score the same windows: the same
    means as one batch per forward, with the remainder (4 = 3 + 1) and more per forward than
    there are batches (9) included."""
    data = dataset_for(tiny_cfg.data.path, 0.1, tmp_path / "ds")
    model = GPT(tiny_cfg.model, len(data.vocab))
    dev = torch.device("cpu")
    calls = []
    model.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape[0]))
    one = evaluate(model, data, tiny_cfg, dev, torch.float32)
    assert calls == [16] * 8  # eval_iters 4 batches of 16, each split
    calls.clear()
    stacked = evaluate(model, data, tiny_cfg, dev, torch.float32, batches_per_forward=per_forward)
    expected = {2: [32, 32], 3: [48, 16], 4: [64], 9: [64]}[per_forward]
    assert calls == expected * 2
    assert stacked["train"] == pytest.approx(one["train"], rel=1e-6)
    assert stacked["val"] == pytest.approx(one["val"], rel=1e-6)


def test_eval_batches_per_forward_fit_the_memory_budget(tiny_cfg):
    # tiny: T 16, C 32, F 128, H 2, V 65 -> 4 * 16 * (512 + 195 + 256 + 32) = 63,680 bytes a row
    per_batch = 63_680 * 16
    assert batches_that_fit(3 * per_batch, tiny_cfg, 65, 16) == 3
    assert batches_that_fit(3 * per_batch - 1, tiny_cfg, 65, 16) == 2
    assert batches_that_fit(10, tiny_cfg, 65, 16) == 1  # never less than one batch
    assert batches_that_fit(10**12, tiny_cfg, 65, 16) == 4  # never more than eval_iters
    assert eval_batches_per_forward(tiny_cfg, torch.device("cpu"), 65, 16) == 1


def test_train_scores_evals_with_the_stacked_batches_eagerly(tiny_cfg, monkeypatch):
    """When evals stack batches (on CUDA), train() scores them with the uncompiled model (the
    compiled graph has the training batch's shape), at the grouping eval_batches_per_forward
    chose, and logs the same losses as one batch a forward. A stand-in for torch.compile's
    wrapper tells the two models apart."""
    cfg = with_(tiny_cfg, train={"max_iters": 20, "eval_interval": 10, "compile": True})

    class Compiled(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, *args):
            return self.inner(*args)

    monkeypatch.setattr(train_module, "compile_model", lambda model, *a: (Compiled(model), None))
    seen = []
    real_evaluate = train_module.evaluate

    def spy(model, *args):
        seen.append((type(model).__name__, args[-1]))
        return real_evaluate(model, *args)

    monkeypatch.setattr(train_module, "evaluate", spy)
    train(cfg)
    ungrouped = read_evals(cfg)
    monkeypatch.setattr(train_module, "eval_batches_per_forward", lambda *a: 3)
    train(cfg, overwrite=True)
    assert seen == [("Compiled", 1)] * 2 + [("GPT", 3)] * 2
    for a, b in zip(ungrouped, read_evals(cfg), strict=True):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)


def read_evals(cfg: RunConfig) -> list[dict]:
    lines = Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "eval"]


def test_bfloat16_loss_close_to_float32(tiny_cfg, tmp_path):
    data = dataset_for(tiny_cfg.data.path, 0.1, tmp_path / "ds")
    model = GPT(tiny_cfg.model, len(data.vocab))
    dev = torch.device("cpu")
    fp32 = evaluate(model, data, tiny_cfg, dev, torch.float32)
    bf16 = evaluate(model, data, tiny_cfg, dev, torch.bfloat16)
    assert bf16["val"] == pytest.approx(fp32["val"], rel=0.02)


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
    cfg = with_(tiny_cfg, train={"compile": True, "max_iters": 6, "eval_interval": 6})
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


def test_auto_dtype_is_bf16_on_a_cpu_with_amx_only(monkeypatch):
    from charlm import device as device_module
    cpu = torch.device("cpu")
    monkeypatch.setattr(device_module, "cpu_has_amx_bf16", lambda: True)
    assert resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(device_module, "cpu_has_amx_bf16", lambda: False)
    assert resolve_dtype("auto", cpu) == torch.float32
    assert resolve_dtype("float32", cpu) == torch.float32


def test_auto_dtype_on_a_gpu_before_ampere_is_float16(monkeypatch):
    """torch.cuda.is_bf16_supported() says yes on a V100 or T4 (emulated bf16, without tensor
    cores): those train in float16 with loss scaling."""
    capability = {}
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: capability[d])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    capability.update({torch.device("cuda", 0): (8, 0), torch.device("cuda", 1): (7, 5)})
    assert resolve_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda", 1)) == torch.float16
    assert resolve_dtype("bfloat16", torch.device("cuda", 1)) == torch.bfloat16  # as asked


def test_a_run_on_cuda_n_makes_that_gpu_the_current_one(monkeypatch):
    """Without it, pinned memory and other lazily made CUDA state went to GPU 0."""
    from charlm.device import distributed
    made_current = []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for device in (torch.device("cuda", 1), torch.device("cuda"), torch.device("cpu")):
        with distributed(device) as (dist, used):
            assert (dist.active, used) == (False, device)
    assert made_current == [torch.device("cuda", 1)]


def test_a_cuda_index_past_the_gpus_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(CharlmError) as e:
        resolve_device("cuda:2", "--device")
    assert str(e.value) == ("--device is 'cuda:2' but this machine has 2 CUDA GPUs (cuda:0 to "
                            "cuda:1); use one of them, or cuda (the first)")


def test_overwrite_with_bad_data_keeps_the_old_run(tiny_cfg, tmp_path):
    cfg = with_(tiny_cfg, train={"max_iters": 20})
    train(cfg)
    run = Path(cfg.train.out_dir)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    bad = with_(cfg, data={"path": str(tmp_path / "missing.txt")})
    with pytest.raises(CharlmError, match="input file not found"):
        train(bad, overwrite=True)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def signal_after_steps(monkeypatch, signals: dict[int, list[int]]) -> None:
    """Make the training loop send itself `signals[n]` right after its n-th train_step."""
    real, calls = train_module.train_step, [0]

    def step(*args, **kwargs):
        out = real(*args, **kwargs)
        calls[0] += 1
        for sig in signals.get(calls[0], []):
            os.kill(os.getpid(), sig)
        return out

    monkeypatch.setattr(train_module, "train_step", step)


def assert_same_weights(a_path: Path, b_path: Path) -> None:
    a, b = checkpoint.load(a_path), checkpoint.load(b_path)
    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_sigterm_saves_last_then_resume_is_exact(tiny_cfg, tmp_path, monkeypatch):
    base = with_(tiny_cfg, train={"max_iters": 30})
    train(with_(base, train={"out_dir": str(tmp_path / "straight")}))
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    run = tmp_path / "split"
    signal_after_steps(monkeypatch, {13: [signal.SIGTERM]})
    with pytest.raises(Interrupted) as e:
        train(with_(base, train={"out_dir": str(run)}))
    assert str(e.value) == (f"interrupted by SIGTERM at step 13: saved {run / 'last.pt'}; "
                            f"continue with `charlm train --out {run} --resume`")
    assert e.value.exit_code == 143
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 13
    monkeypatch.undo()
    assert train(resume_config(run, None, []), resume=True).step == 30
    assert_same_weights(tmp_path / "straight" / "last.pt", run / "last.pt")


def test_second_ctrl_c_aborts_without_partial_file(tiny_cfg, monkeypatch):
    cfg = with_(tiny_cfg, train={"eval_interval": 2})
    run = Path(cfg.train.out_dir)
    saved: list[bytes] = []
    real_save = torch.save

    def save_then_ctrl_c(obj, f):  # the second Ctrl-C lands in the middle of the interrupt save
        saved.append((run / "last.pt").read_bytes() if (run / "last.pt").exists() else b"")
        if len(saved) == 3:
            os.kill(os.getpid(), signal.SIGINT)
        real_save(obj, f)

    signal_after_steps(monkeypatch, {3: [signal.SIGINT]})
    monkeypatch.setattr(torch, "save", save_then_ctrl_c)
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as e:
        train(cfg)
    assert not isinstance(e.value, Interrupted)
    assert signal.getsignal(signal.SIGINT) == handler
    assert len(saved) == 3  # best.pt and last.pt at step 2, then the aborted save at step 3
    assert (run / "last.pt").read_bytes() == saved[-1]
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 2
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]


@pytest.mark.parametrize("name, quote", [("run", ""), ("my run ελ", "'")])
def test_cli_train_exits_130_on_ctrl_c(cli, tmp_path, corpus, monkeypatch, name, quote):
    """The command it suggests can be pasted into a shell: a run dir with a space (`charlm train
    "my notes.txt"` trains into runs/my notes) is quoted."""
    signal_after_steps(monkeypatch, {4: [signal.SIGINT]})
    run = tmp_path / name
    result = cli("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run)
    assert result.code == 130
    assert result.err.endswith(f"interrupted by SIGINT at step 4: saved {run / 'last.pt'}; "
                               f"continue with `charlm train --out {quote}{run}{quote} --resume`\n")
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 4


def test_resume_after_sigkill_is_exact(cli, tiny_cfg, tmp_path):
    """A real `charlm train` process killed between two checkpoints, resumed from its last.pt,
    ends with the same weights as an uninterrupted run (same max_iters, so the same schedule)."""
    cfg = with_(tiny_cfg, train={"max_iters": 80, "eval_interval": 10, "eval_iters": 1,
                                 "log_interval": 1})
    train(with_(cfg, train={"out_dir": str(tmp_path / "straight")}))
    run = Path(cfg.train.out_dir)
    config = tmp_path / "run.yaml"
    save_config(cfg, config)
    proc = subprocess.Popen([sys.executable, "-m", "charlm", "train", config],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics, deadline = run / "metrics.jsonl", time.monotonic() + 60
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []
            steps = [json.loads(line)["step"] for line in lines]  # complete lines only
            if (run / "last.pt").exists() and steps and steps[-1] % 10:  # between checkpoints
                break
            time.sleep(0.002)
        proc.kill()
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    killed_at = checkpoint.load(run / "last.pt")["train_state"]["step"]
    assert killed_at % 10 == 0 and 10 <= killed_at < 80
    result = cli("train", "--out", run, "--resume")
    assert result.code == 0, result.err
    assert "done: 80 steps" in result.out
    assert_same_weights(tmp_path / "straight" / "last.pt", run / "last.pt")


def test_resume_removes_the_half_saved_checkpoints_of_a_killed_run(tiny_cfg):
    """A run killed inside checkpoint.save leaves its temporary file (as big as a checkpoint)
    beside last.pt / best.pt; the resume, which holds the run lock, removes such files and
    nothing else."""
    cfg = with_(tiny_cfg, train={"max_iters": 2, "eval_interval": 2, "eval_iters": 1,
                                 "sample_chars": 0})
    train(cfg)
    run = Path(cfg.train.out_dir)
    left = [run / ".last.pt.tmp-4242", run / ".best.pt.tmp-17", run / ".metrics.jsonl.tmp-5"]
    kept = [run / ".last.pt.tmp-notes", run / "last.pt.tmp-1", run / "notes.txt"]
    for path in left + kept:
        path.write_bytes(b"PK\x03\x04")
    train(with_(cfg, train={"max_iters": 3}), resume=True)
    assert not any(path.exists() for path in left)
    assert all(path.read_bytes() == b"PK\x03\x04" for path in kept)


class Killed(BaseException):
    """A process death in the middle of the loop (nothing after it runs, as after SIGKILL)."""


@pytest.mark.parametrize("dies_in", ["last.pt", "best.pt"])
def test_a_crash_between_the_saves_of_an_improved_eval_keeps_best_pt_the_best(dies_in, tiny_cfg,
                                                                               monkeypatch):
    """A run killed while it writes the checkpoints of its final eval, which improved, and then
    resumed: best.pt is that step's model, the one with the lowest val (when last.pt was
    written first, a death before best.pt left last.pt counting a best val that no best.pt
    held, and the resume, with nothing left to train, kept the older best.pt for good)."""
    cfg = with_(tiny_cfg, train={"max_iters": 4, "eval_interval": 2, "eval_iters": 1,
                                 "sample_chars": 0})
    run = Path(cfg.train.out_dir)
    real_save = checkpoint.save

    def save_or_die(state, path):
        if state["train_state"]["step"] == 4 and Path(path).name == dies_in:
            raise Killed
        real_save(state, path)

    monkeypatch.setattr(checkpoint, "save", save_or_die)
    with pytest.raises(Killed):
        train(cfg)
    monkeypatch.undo()
    train(cfg, resume=True)
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    vals = {e["step"]: e["val_loss"] for e in evals if e["event"] == "eval"}
    assert list(vals) == [2, 4] and vals[4] < vals[2]
    best = checkpoint.load(run / "best.pt")
    assert best["train_state"]["step"] == 4 and best["train_state"]["best_val"] == vals[4]
    assert_same_weights(run / "best.pt", run / "last.pt")


def test_checkpoint_interval_sets_last_and_best_follows_evals(tiny_cfg, monkeypatch):
    cfg = with_(tiny_cfg, train={"max_iters": 25, "eval_interval": 10, "checkpoint_interval": 4})
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
    monkeypatch.setattr(train_module, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    real_step, real_eval = train_module.train_step, train_module.evaluate

    def step(*args):
        clock[0] += 1.0
        return real_step(*args)

    def evaluate_slowly(*args):
        clock[0] += 100.0
        return real_eval(*args)

    monkeypatch.setattr(train_module, "train_step", step)
    monkeypatch.setattr(train_module, "evaluate", evaluate_slowly)
    train(cfg)
    lines = Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()
    logged = [json.loads(line) for line in lines]
    rates = [(e["step"], e["tokens_per_s"]) for e in logged if e["event"] == "train"]
    assert rates == [(4, 16 * 16), (8, 16 * 16)]


def nan_loss_at_steps(monkeypatch, bad: set[int]) -> None:
    """Make the training loss NaN at the given steps (1-based; grad_accum 1)."""
    real, calls = GPT.forward, [0]

    def forward(self, idx, targets=None, cache=None):
        logits, loss = real(self, idx, targets, cache)
        if targets is not None and self.training:
            calls[0] += 1
            if calls[0] in bad:
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)


def weights_after_each_step(monkeypatch) -> list[list[torch.Tensor]]:
    real, weights = train_module.train_step, []

    def step(model, *args):
        out = real(model, *args)
        weights.append([p.detach().clone() for p in model.parameters()])
        return out

    monkeypatch.setattr(train_module, "train_step", step)
    return weights


def test_metrics_of_skipped_steps_are_strict_json_with_null(tiny_cfg, monkeypatch):
    """A skipped step's NaN loss and grad norm are written as null, not as NaN, which strict
    JSON parsers reject."""
    cfg = with_(tiny_cfg, train={"max_iters": 5, "log_interval": 1, "eval_interval": 100})
    nan_loss_at_steps(monkeypatch, {3})
    train(cfg)

    def strict(constant):
        raise ValueError(f"not JSON: {constant}")

    lines = Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()
    events = [json.loads(line, parse_constant=strict) for line in lines]
    losses = {e["step"]: e["train_loss"] for e in events if e["event"] == "train"}
    assert losses[3] is None and all(isinstance(losses[s], float) for s in (1, 2, 4, 5))


def test_non_finite_loss_skips_the_update_and_is_counted(tiny_cfg, monkeypatch, capsys):
    cfg = with_(tiny_cfg, train={"max_iters": 8, "log_interval": 1, "eval_interval": 100})
    nan_loss_at_steps(monkeypatch, {3, 4})
    weights = weights_after_each_step(monkeypatch)
    state = train(cfg)
    assert state.skipped_steps == 2
    for step in (3, 4):  # weights after steps 3 and 4 are those after step 2
        assert all(torch.equal(a, b) for a, b in zip(weights[1], weights[step - 1], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(weights[1], weights[4], strict=True))
    events = [json.loads(line) for line in
              Path(cfg.train.out_dir, "metrics.jsonl").read_text().splitlines()]
    assert [e["skipped_steps"] for e in events if e["event"] == "train"] == [0, 0, 1, 2, 2, 2, 2, 2]
    assert "step 3: skipped 1 update(s) with a non-finite loss or gradient norm (1 so far)" \
        in capsys.readouterr().out
    last = checkpoint.load(Path(cfg.train.out_dir, "last.pt"))
    assert last["train_state"]["skipped_steps"] == 2
    assert int(last["optimizer"]["state"][0]["step"]) == 6  # 8 steps, 2 updates skipped


def test_too_many_bad_steps_before_any_checkpoint_say_start_over(tiny_cfg, monkeypatch):
    cfg = with_(tiny_cfg, train={"max_iters": 20, "log_interval": 1, "eval_interval": 10,
                                 "max_bad_steps": 2})
    nan_loss_at_steps(monkeypatch, set(range(1, 21)))
    with pytest.raises(CharlmError) as e:
        train(cfg)
    assert str(e.value) == (
        "training stopped: 2 steps in a row, up to step 2, had a non-finite loss or gradient "
        "norm (their updates were skipped); no checkpoint was written; lower optim.lr, raise "
        "optim.warmup_iters or check the data, then start over with --overwrite")


def test_too_many_bad_steps_stop_the_run_and_keep_the_checkpoint(tiny_cfg, monkeypatch):
    cfg = with_(tiny_cfg, train={"max_iters": 20, "log_interval": 1, "eval_interval": 2,
                                 "max_bad_steps": 3})
    nan_loss_at_steps(monkeypatch, set(range(4, 21)))
    weights = weights_after_each_step(monkeypatch)
    last_pt = Path(cfg.train.out_dir, "last.pt")
    with pytest.raises(CharlmError) as e:
        train(cfg)
    assert str(e.value) == (
        f"training stopped: 3 steps in a row, up to step 6, had a non-finite loss or gradient "
        f"norm (their updates were skipped); the last checkpoint {last_pt} (step 4) is intact; "
        "lower optim.lr, raise optim.warmup_iters or check the data, then resume or start over")
    assert len(weights) == 6
    last = checkpoint.load(last_pt)
    assert last["train_state"]["step"] == 4
    model = GPT(cfg.model, len(last["vocab"]))
    model.load_state_dict(last["model"])
    assert all(torch.equal(a, b) for a, b in zip(weights[2], model.parameters(), strict=True))


def interrupted_after_two_bad_steps(tiny_cfg: RunConfig, monkeypatch: pytest.MonkeyPatch,
                                    max_bad_steps: int) -> RunConfig:
    """An 8-step run whose steps 3 and 4 are bad, stopped by SIGTERM after step 4 (last.pt at
    step 4); the patches are undone, ready for the resume's own."""
    cfg = with_(tiny_cfg, train={"max_iters": 8, "log_interval": 1, "eval_interval": 100,
                                 "max_bad_steps": max_bad_steps, "sample_chars": 0})
    nan_loss_at_steps(monkeypatch, {3, 4})
    signal_after_steps(monkeypatch, {4: [signal.SIGTERM]})
    with pytest.raises(Interrupted):
        train(cfg)
    monkeypatch.undo()
    return cfg


def test_a_streak_of_bad_steps_goes_on_across_an_interrupt_and_resume(tiny_cfg, monkeypatch):
    """Steps 3 to 5 are bad and max_bad_steps is 3: interrupted at step 4 (two bad so far) and
    resumed, the run stops at step 5 as it would have without the interrupt."""
    cfg = interrupted_after_two_bad_steps(tiny_cfg, monkeypatch, max_bad_steps=3)
    nan_loss_at_steps(monkeypatch, {1})  # step 5, the first of the resumed run
    last_pt = Path(cfg.train.out_dir, "last.pt")
    with pytest.raises(CharlmError) as e:
        train(cfg, resume=True)
    assert str(e.value).startswith("training stopped: 3 steps in a row, up to step 5, had a "
                                   f"non-finite loss or gradient norm (their updates were "
                                   f"skipped); the last checkpoint {last_pt} (step 4) is intact")


def test_a_resume_with_max_bad_steps_below_the_streak_stops_at_the_next_bad_step(
        tiny_cfg, monkeypatch):
    """Interrupted after two bad steps in a row (max_bad_steps 5), resumed with max_bad_steps 2:
    the streak is already past the new limit, and the next bad step stops the run (the streak
    counted 3, 4, ... and never equalled 2, so the run went on with every update skipped)."""
    cfg = interrupted_after_two_bad_steps(tiny_cfg, monkeypatch, max_bad_steps=5)
    nan_loss_at_steps(monkeypatch, {1, 2, 3, 4})  # steps 5 to 8, all of the resumed run
    with pytest.raises(CharlmError, match=r"^training stopped: 2 steps in a row, up to step 5,"):
        train(with_(cfg, train={"max_bad_steps": 2}), resume=True)


def test_an_eval_of_a_diverged_model_logs_no_sample_and_the_run_goes_on(tiny_cfg, capsys):
    # lr 1e9: step 1 sends the weights so far that every later loss (and the eval's sampled
    # preview) is NaN; the preview must not end the run, max_bad_steps decides.
    cfg = with_(tiny_cfg, optim={"lr": 1e9, "min_lr": 0.0, "warmup_iters": 0},
                train={"max_iters": 3, "eval_interval": 3, "eval_iters": 1, "max_bad_steps": 10})
    state = train(cfg)
    assert (state.step, state.skipped_steps) == (3, 2)
    assert "step 3: no sample, the model's outputs are not finite" in capsys.readouterr().out
    assert checkpoint.load(Path(cfg.train.out_dir, "last.pt"))["train_state"]["step"] == 3


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_learns_on_the_tiny_config(variant, tiny_cfg, tmp_path):
    cfg = with_(tiny_cfg, model=VARIANTS[variant], train={"max_iters": 60, "eval_iters": 2})
    dev, fp32 = torch.device("cpu"), torch.float32
    data = dataset_for(cfg.data.path, cfg.data.val_fraction, tmp_path / "ds")
    model = GPT(cfg.model, len(data.vocab))
    optimizer = make_optimizer(model, cfg.optim)
    sampler = BatchSampler(data.train, cfg.model.block_size, cfg.train.batch_size, dev, 0)
    before = evaluate(model, data, cfg, dev, fp32)["val"]
    for step in range(cfg.train.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.optim, cfg.train.max_iters)
        train_step(model, optimizer, grad_scaler(dev, fp32), sampler, cfg, dev, fp32)
    after = evaluate(model, data, cfg, dev, fp32)["val"]
    assert after < before - 0.7, (before, after)
