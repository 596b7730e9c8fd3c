import os
import pickle
import random
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from charlm.core.errors import CharlmError
from charlm.training import checkpoint
from charlm.training import run_objects as run_module
from charlm.training.loop import train
from charlm.training.run_dir import resume_config
from tests.helpers import assert_same_weights, with_


def test_save_load_round_trip_leaves_no_temp_files(tmp_path):
    state = {"model": {"w": torch.arange(6.0)}, "vocab": ["a", "b"], "config": {"x": 1}}
    path = tmp_path / "last.pt"
    checkpoint.save(state, path)
    loaded = checkpoint.load(path)
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["vocab"] == ["a", "b"] and loaded["version"] == checkpoint.VERSION
    assert os.listdir(tmp_path) == ["last.pt"]


def test_failed_save_keeps_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 1}, path)
    before = path.read_bytes()

    def disk_full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CharlmError, match=f"cannot write checkpoint {path}: No space left on "
                                          "device; the previous last.pt, if any, is unchanged"):
        checkpoint.save({"step": 2}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["last.pt"]


def test_a_disk_that_fills_up_inside_torch_save_is_one_error_line(tmp_path, monkeypatch):
    """torch's zip writer turns the OSError of a failed write into a RuntimeError (seen on a full
    tmpfs: `unexpected pos 34944 vs 34896`); it is the same error line, not a traceback."""
    path = tmp_path / "last.pt"
    checkpoint.save({"step": 1}, path)
    before = path.read_bytes()

    def zip_writer_on_a_full_disk(obj, f):
        f.write(b"PK")
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError(  # noqa: B904 (raised as torch raises it)
                "[enforce fail at inline_container.cc:672] . unexpected pos 34944 vs 34896")

    monkeypatch.setattr(torch, "save", zip_writer_on_a_full_disk)
    with pytest.raises(CharlmError) as e:
        checkpoint.save({"step": 2}, path)
    assert str(e.value) == (
        f"cannot write checkpoint {path}: No space left on device; the previous last.pt, if "
        "any, is unchanged; free disk space (or fix the run dir), then continue with --resume")
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["last.pt"]


class Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_pickle_payload_is_refused_and_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        torch.save({"format": checkpoint.FORMAT, "payload": Payload()}, f)
    with pytest.raises(CharlmError, match="cannot load checkpoint .*evil.pt"):
        checkpoint.load(path)
    assert not (tmp_path / "PWNED").exists()


def _truncated_checkpoint(tmp_path) -> bytes:
    checkpoint.save({"model": {"w": torch.zeros(1000)}}, tmp_path / "whole.pt")
    whole = (tmp_path / "whole.pt").read_bytes()
    return whole[: len(whole) // 2]


@pytest.mark.parametrize("content", [b"", b"\x00garbage" * 10, pickle.dumps([1, 2], protocol=2),
                                     _truncated_checkpoint])
def test_garbage_files_give_clear_errors(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content(tmp_path) if callable(content) else content)
    with pytest.raises(CharlmError, match="cannot load checkpoint|not a charlm checkpoint"):
        checkpoint.load(path)


@pytest.mark.parametrize("content", [b"hello\n", b"", _truncated_checkpoint])
def test_a_file_that_is_not_a_whole_checkpoint_names_it_in_one_line(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content(tmp_path) if callable(content) else content)
    with pytest.raises(CharlmError) as e:
        checkpoint.load(path)
    assert str(e.value) == (f"cannot load checkpoint {path}: not a readable charlm checkpoint "
                            "(not a complete torch.save file)")


class _RunsCode:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_a_checkpoint_with_pickled_code_is_refused_in_plain_words(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "version": checkpoint.VERSION, "x": _RunsCode()},
               path)
    with pytest.raises(CharlmError) as e:
        checkpoint.load(path)
    assert str(e.value) == (f"cannot load checkpoint {path}: not a readable charlm checkpoint (it "
                            "is not a checkpoint, or it holds pickled code, which charlm never "
                            "runs)")
    assert "must never run" not in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_a_fifo_is_refused_without_reading_it(tmp_path):
    """Reading a FIFO (or /dev/zero) as a checkpoint would wait for a writer forever."""
    fifo = tmp_path / "best.pt"
    os.mkfifo(fifo)
    # Without the check, load would block here; a writer that gives EOF after a while makes
    # such a load fail with another message instead of hanging the suite.
    writer = threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True)
    writer.start()
    try:
        with pytest.raises(CharlmError) as e:
            checkpoint.load(fifo)
        assert str(e.value) == (f"cannot load checkpoint {fifo}: not a regular file (a "
                                "directory, FIFO or device); give a .pt file that charlm train "
                                "wrote")
    finally:  # a reader lets the writer's open return, whenever it comes
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            writer.join(5)
            assert not writer.is_alive()
        finally:
            os.close(reader)


GOOD_TRAIN_STATE = {"step": 20, "best_val": 3.3, "tokens": 5120, "skipped_steps": 0,
                    "bad_streak": 0}


@pytest.mark.parametrize("change", [{"step": 20.5}, {"step": -5}, {"step": True},
                                    {"tokens": float("nan")}, {"best_val": "3.3"},
                                    {"skipped_steps": -1}])
def test_a_train_state_with_a_step_that_is_not_a_count_is_malformed(change):
    """A float step made --resume end in a TypeError traceback; a negative one trained on."""
    checkpoint.check_train_state({"train_state": GOOD_TRAIN_STATE})
    with pytest.raises(ValueError, match="^train_state is missing or malformed$"):
        checkpoint.check_train_state({"train_state": {**GOOD_TRAIN_STATE, **change}})


def test_foreign_and_future_checkpoints(tmp_path):
    foreign = tmp_path / "ckpt.pt"  # what nanoGPT writes: no format marker
    torch.save({"model": {}, "model_args": {"n_layer": 1}, "iter_num": 3}, foreign)
    with pytest.raises(CharlmError, match="is not a charlm checkpoint"):
        checkpoint.load(foreign)
    future = tmp_path / "future.pt"
    torch.save({"format": checkpoint.FORMAT, "version": 99}, future)
    with pytest.raises(CharlmError, match="format version 99, this charlm reads version 1"):
        checkpoint.load(future)


def test_resolve_prefers_best_then_last(tmp_path):
    with pytest.raises(CharlmError, match="no checkpoint"):
        checkpoint.resolve(tmp_path)
    (tmp_path / "last.pt").write_bytes(b"x")
    assert checkpoint.resolve(tmp_path) == tmp_path / "last.pt"
    (tmp_path / "best.pt").write_bytes(b"x")
    assert checkpoint.resolve(tmp_path) == tmp_path / "best.pt"
    with pytest.raises(CharlmError, match="no such run dir or checkpoint"):
        checkpoint.resolve(tmp_path / "nope")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_sigkill_at_random_moments_leaves_a_complete_checkpoint(tmp_path):
    """A child process rewrites last.pt in a loop; killed at random moments, it must always
    leave the old or the new complete file."""
    path = tmp_path / "last.pt"
    # Built before forking, so the child only serialises and writes (no torch thread pools).
    states = [{"step": i, "model": {"w": torch.full((64, 1024), float(i))}} for i in range(4)]
    checkpoint.save(states[0], path)
    rng = random.Random(0)
    for _ in range(25):
        pid = os.fork()
        if pid == 0:  # the writer; it never returns into pytest
            try:
                i = 0
                while True:
                    i += 1
                    checkpoint.save(states[i % len(states)], path)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        state = checkpoint.load(path)
        assert torch.equal(state["model"]["w"], states[state["step"]]["model"]["w"])
    tmp_files = [p.name for p in tmp_path.iterdir() if p.name != "last.pt"]
    assert tmp_files, "no kill landed in the middle of a save"
    assert all(name.startswith(".last.pt.tmp-") for name in tmp_files)  # a killed writer's


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
    assert (state.step, state.skipped_steps, state.bad_streak) == (30, 0, 0)
    assert_same_weights(tmp_path / "straight" / "last.pt", run / "last.pt")
    a, b = (checkpoint.load(p / "last.pt") for p in (tmp_path / "straight", run))
    assert a["train_state"] == {**b["train_state"], "elapsed_s": a["train_state"]["elapsed_s"]}
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
