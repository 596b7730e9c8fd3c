import json
import math
from pathlib import Path

import pytest
import torch

from charlm import checkpoint
from charlm.config import OptimConfig, RunConfig
from charlm.data import BatchSampler, dataset_for
from charlm.device import grad_scaler, resolve_dtype
from charlm.errors import CharlmError
from charlm.generate import generate
from charlm.model import GPT
from charlm.train import evaluate, lr_at, make_optimizer, resume_config, train, train_step

from .conftest import VARIANTS


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
    out = vocab.decode(torch.cat(list(generate(model, prompt, 60, temperature=0))).tolist())
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


def test_existing_run_is_not_clobbered(tiny_cfg):
    cfg = with_(tiny_cfg, train={"max_iters": 20})
    train(cfg)
    last_pt = Path(cfg.train.out_dir, "last.pt")
    last = last_pt.read_bytes()
    with pytest.raises(CharlmError, match="already holds a run .* --resume, .* --overwrite"):
        train(cfg)
    assert last_pt.read_bytes() == last
    train(cfg, overwrite=True)  # explicit consent starts over


def test_evaluate_is_pure_and_restores_train_mode(tiny_cfg, tmp_path):
    data = dataset_for(tiny_cfg.data.path, 0.1, tmp_path / "ds")
    model = GPT(tiny_cfg.model, len(data.vocab)).train()
    rng = torch.get_rng_state()
    dev = torch.device("cpu")
    a = evaluate(model, data, tiny_cfg, dev, resolve_dtype("float32", dev))
    b = evaluate(model, data, tiny_cfg, dev, resolve_dtype("float32", dev))
    assert a == b and model.training
    assert torch.equal(rng, torch.get_rng_state())


def test_bfloat16_loss_close_to_float32(tiny_cfg, tmp_path):
    data = dataset_for(tiny_cfg.data.path, 0.1, tmp_path / "ds")
    model = GPT(tiny_cfg.model, len(data.vocab))
    dev = torch.device("cpu")
    fp32 = evaluate(model, data, tiny_cfg, dev, torch.float32)
    bf16 = evaluate(model, data, tiny_cfg, dev, torch.bfloat16)
    assert bf16["val"] == pytest.approx(fp32["val"], rel=0.02)


def test_overwrite_with_bad_data_keeps_the_old_run(tiny_cfg, tmp_path):
    cfg = with_(tiny_cfg, train={"max_iters": 20})
    train(cfg)
    run = Path(cfg.train.out_dir)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    bad = with_(cfg, data={"path": str(tmp_path / "missing.txt")})
    with pytest.raises(CharlmError, match="input file not found"):
        train(bad, overwrite=True)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_learns_on_the_tiny_config(variant, tiny_cfg, tmp_path):
    cfg = with_(tiny_cfg, model=VARIANTS[variant], train={"max_iters": 60, "eval_iters": 2})
    dev, fp32 = torch.device("cpu"), torch.float32
    data = dataset_for(cfg.data.path, cfg.data.val_fraction, tmp_path / "ds")
    model = GPT(cfg.model, len(data.vocab))
    optimizer = make_optimizer(model, cfg.optim, dev)
    sampler = BatchSampler(data.train, cfg.model.block_size, cfg.train.batch_size, dev, 0)
    before = evaluate(model, data, cfg, dev, fp32)["val"]
    for step in range(cfg.train.max_iters):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.optim, cfg.train.max_iters)
        train_step(model, optimizer, grad_scaler(dev, fp32), sampler, cfg, dev, fp32)
    after = evaluate(model, data, cfg, dev, fp32)["val"]
    assert after < before - 0.7, (before, after)
