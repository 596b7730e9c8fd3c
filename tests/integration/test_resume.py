"""Resuming a run: it ends with the weights, optimizer state and train state of an uninterrupted
run, across devices, loss scaling, config changes and older checkpoint layouts."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from charlm.core.errors import CharlmError
from charlm.runtime.profile import Machine
from charlm.training import checkpoint
from charlm.training import run_objects as run_module
from charlm.training.loop import train
from charlm.training.resume import resume_config
from tests.helpers import assert_same_weights, files_under, with_


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


def test_a_default_run_resumed_in_a_copied_run_dir_beside_busy_processes_is_bitwise(
        tiny_cfg, tmp_path, monkeypatch):
    """`train.threads: auto` once followed the load mid-run, and results depend on the thread
    count: a run resumed beside other work ended 16 of 16 tensors away from the straight run.
    Now the profile decides once (here on an idle machine: 2 threads) and config.yaml records
    it; the run dir copied elsewhere and resumed beside two busy processes, where `auto` would
    take 1 thread, computes with the 2 recorded and ends bitwise equal to the straight run. The
    same resume pinned to 1 thread does not: the count matters to the last bits."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(Machine, "cores", lambda self: 2)
    monkeypatch.setattr(Machine, "busy_elsewhere", lambda self: 0.0)
    base = with_(tiny_cfg, optim={"lr_decay_iters": 16}, train={
        "max_iters": 16, "eval_interval": 8, "eval_iters": 1, "sample_chars": 0,
        "threads": "auto"})
    train(with_(base, train={"out_dir": str(tmp_path / "straight")}))
    train(with_(base, train={"max_iters": 8, "out_dir": str(tmp_path / "split")}))
    recorded = yaml.safe_load((tmp_path / "split" / "config.yaml").read_text())["train"]
    assert recorded["threads"] == 2
    monkeypatch.setattr(Machine, "busy_elsewhere", lambda self: 2.0)  # what it would read now
    for name in ("copy", "one"):
        shutil.copytree(tmp_path / "split", tmp_path / name)

    def resume(name: str, *overrides: str) -> None:
        train(resume_config(tmp_path / name, None, [
            "train.max_iters=16", f"train.out_dir={tmp_path / name}", *overrides]), resume=True)

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        resume("copy")
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    resume("one", "train.threads=1")
    assert_same_weights(tmp_path / "straight" / "last.pt", tmp_path / "copy" / "last.pt")
    one = checkpoint.load(tmp_path / "one" / "last.pt")["model"]
    straight = checkpoint.load(tmp_path / "straight" / "last.pt")["model"]
    assert any(not torch.equal(one[k], straight[k]) for k in straight)


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
        m.setattr(run_module, "grad_scaler",
                  lambda device, dtype: torch.amp.GradScaler("cpu", enabled=True))
        assert train(resume_config(run, None, ["train.max_iters=3"]), resume=True).step == 3
    assert checkpoint.load(run / "last.pt")["scaler"]["scale"] == 2.0**16
    assert train(resume_config(run, None, ["train.max_iters=4"]), resume=True).step == 4


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


# The top-level keys and train state fields of format version 1, as charlm wrote them before its
# checkpoints were one map of stateful objects.
V1_KEYS = ["format", "version", "model", "optimizer", "scaler", "train_state", "sampler", "rng",
           "config", "vocab"]


V1_TRAIN_STATE = ["step", "best_val", "tokens", "elapsed_s", "skipped_steps", "bad_streak"]


@pytest.mark.parametrize("counters", [True, False])
def test_a_checkpoint_in_the_version_1_layout_resumes_exactly(counters, tiny_cfg, tmp_path):
    """last.pt rewritten by hand in the layout of version 1 (plain dicts under today's keys; a
    train state with or without the skipped-step counters, which came later), then resumed:
    the weights, optimizer moments and train state end as those of an uninterrupted run. The
    layout written today is still exactly version 1's."""
    base = with_(tiny_cfg, optim={"lr_decay_iters": 30},
                 train={"max_iters": 30, "eval_interval": 10, "sample_chars": 0})
    train(with_(base, train={"out_dir": str(tmp_path / "straight")}))
    run = tmp_path / "split"
    train(with_(base, train={"max_iters": 20, "out_dir": str(run)}))
    new = checkpoint.load(run / "last.pt")
    assert list(new) == V1_KEYS and list(new["train_state"]) == V1_TRAIN_STATE
    assert list(new["rng"]) == ["torch"] and new["scaler"] == {}
    ts = new["train_state"]
    old = {
        "format": "charlm-checkpoint", "version": 1,
        "model": dict(new["model"]),
        "optimizer": {"state": new["optimizer"]["state"],
                      "param_groups": new["optimizer"]["param_groups"]},
        "scaler": {},
        "train_state": {"step": int(ts["step"]), "best_val": float(ts["best_val"]),
                        "tokens": int(ts["tokens"]), "elapsed_s": float(ts["elapsed_s"]),
                        **({"skipped_steps": 0, "bad_streak": 0} if counters else {})},
        "sampler": {"generator": new["sampler"]["generator"]},
        "rng": {"torch": new["rng"]["torch"]},
        "config": new["config"],
        "vocab": list(new["vocab"]),
    }
    torch.save(old, run / "last.pt")
    state = train(resume_config(run, None, ["train.max_iters=30"]), resume=True)
    assert (state.step, state.bad.state_dict()) == (30, {"skipped_steps": 0, "bad_streak": 0})
    assert_same_weights(tmp_path / "straight" / "last.pt", run / "last.pt")
    a, b = (checkpoint.load(p / "last.pt") for p in (tmp_path / "straight", run))
    assert a["train_state"] == {**b["train_state"], "elapsed_s": a["train_state"]["elapsed_s"]}
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)


def test_edits_of_config_yaml_apply_on_resume_and_a_finished_run_has_nothing_to_train(cli,
                                                                                      tiny_cfg):
    """Resumed as it was, a finished run said "done: 4 steps" with exit 0; with max_iters
    raised in RUN/config.yaml it said the same, trained nothing and wrote 4 back over the
    edit. Now the first is one error that leaves every file as it was, the edit trains on
    (and is said), and an edit of the architecture is refused like a --set of it."""
    cfg = with_(tiny_cfg, train={"max_iters": 4, "eval_interval": 2, "eval_iters": 1,
                                 "sample_chars": 0})
    train(cfg)
    run = Path(cfg.train.out_dir)
    before = files_under(run)
    again = cli("train", "--out", run, "--resume")
    assert (again.code, again.err) == (
        2, f"error: --resume: nothing to train: {run / 'last.pt'} is at step 4 and "
           "train.max_iters is 4; to train on, resume with --set train.max_iters=N (N above 4)\n")
    assert files_under(run) == before
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("max_iters: 4", "max_iters: 6"))
    edited = cli("train", "--out", run, "--resume")
    assert edited.code == 0, edited.err
    assert edited.err == f"--resume: applying the edits of {config}: train.max_iters 4 -> 6\n"
    assert "done: 6 steps" in edited.out
    assert checkpoint.load(run / "last.pt")["config"]["train"]["max_iters"] == 6
    assert "max_iters: 6" in config.read_text()
    config.write_text(config.read_text().replace("n_layer: 2", "n_layer: 3"))
    before = files_under(run)
    arch = cli("train", "--out", run, "--resume", "--set", "train.max_iters=8")
    assert (arch.code, arch.err) == (
        2, f"error: --resume: model.n_layer=3 in {config} conflicts with the checkpoint's 2 in "
           f"{run / 'last.pt'}; the architecture of a run cannot change (undo that edit, or "
           "start a new run with another --out)\n")
    assert files_under(run) == before


def test_a_muon_run_resumes_bitwise_and_keeps_its_optimizer(tiny_cfg, tmp_path, fails):
    """optim.name=muon: 12 steps straight and 6 + --resume 6 end with the same weights, Muon's
    momentum buffers and AdamW's moments; resuming it as adamw is one error line naming the
    checkpoint, and the run's files stay as they were."""
    base = with_(tiny_cfg, optim={"name": "muon", "lr_decay_iters": 12},
                 train={"max_iters": 12, "eval_interval": 6, "eval_iters": 1, "sample_chars": 0})
    train(with_(base, train={"out_dir": str(tmp_path / "straight")}))
    train(with_(base, train={"max_iters": 6, "out_dir": str(tmp_path / "split")}))
    state = train(resume_config(tmp_path / "split", None, ["train.max_iters=12"]), resume=True)
    assert state.step == 12
    assert_same_weights(tmp_path / "straight" / "last.pt", tmp_path / "split" / "last.pt")
    a = checkpoint.load(tmp_path / "straight" / "last.pt")["optimizer"]
    b = checkpoint.load(tmp_path / "split" / "last.pt")["optimizer"]
    assert set(a) == {"adamw", "muon"} and a["muon"]["state"]
    for name, moment in (("adamw", "exp_avg_sq"), ("muon", "momentum_buffer")):
        sa, sb = a[name]["state"], b[name]["state"]
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k][moment], sb[k][moment])
                                              for k in sa)
    run = tmp_path / "split"
    fails("train", "--out", run, "--resume", "--set", "train.max_iters=14", "--set",
          "optim.name=adamw",
          message=f"--resume: optim.name='adamw' conflicts with the checkpoint's 'muon' in "
                  f"{run / 'last.pt'}; a run keeps its optimizer (drop the override, or start a "
                  "new run with another --out)")


def test_a_weight_average_is_what_the_run_shows_and_resumes_bitwise(tiny_cfg, tmp_path):
    """`optim.ema`: a checkpoint's "model" is the average (what sample and eval read), the
    trained weights beside it; a resume continues both as an uninterrupted run does, and one
    that turns the average off is refused in one line."""
    base = with_(tiny_cfg, optim={"lr_decay_iters": 20, "ema": 0.9},
                 train={"max_iters": 20, "eval_interval": 10, "eval_iters": 1})
    train(with_(base, train={"out_dir": str(tmp_path / "straight")}))
    train(with_(base, train={"max_iters": 10, "out_dir": str(tmp_path / "split")}))
    train(resume_config(tmp_path / "split", None, ["train.max_iters=20"]), resume=True)
    a = checkpoint.load(tmp_path / "straight" / "last.pt")
    b = checkpoint.load(tmp_path / "split" / "last.pt")
    for part in ("model", "train_model"):
        for key, value in a[part].items():
            assert torch.equal(value, b[part][key]), (part, key)
    assert int(a["average"]["updates"]) == 20
    assert not torch.equal(a["model"]["wte.weight"], a["train_model"]["wte.weight"])
    with pytest.raises(CharlmError, match=r"^--resume: optim.ema=0 cannot apply: the run was "
                       r"trained with a weight average \(optim.ema=0.9\); resume with --set "
                       r"optim.ema=0.9, or start a new run$"):
        train(resume_config(tmp_path / "split", None, ["train.max_iters=30", "optim.ema=0"]),
              resume=True)
