"""DDP through torchrun on the CPU (gloo): two processes train as one would on the same global
batch, a DDP run resumes, and a failure of process 0 ends the others quietly."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from charlm.config.loading import save_config
from charlm.data.batches import BatchSampler
from charlm.runtime.distributed import Dist
from charlm.training import checkpoint
from charlm.training import loop as train_module
from charlm.training.loop import train
from charlm.training.optimizer import make_optimizer
from tests.helpers import ROOT, pairs_config, reversal_pairs, with_, write_pairs

LAUNCH_FAILURES = ("EADDRINUSE", "address already in use", "DistNetworkError", "Rendezvous")


def torchrun(args: list, cwd: Path) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=2 -m charlm ARGS` (rendezvous on loopback).
    Its TMPDIR is a temporary dir of its own: torchrun leaves a torchelastic_* dir there."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": tmp}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", "-m", "charlm", *map(str, args)]
        result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                                timeout=120)
        # --standalone picks a free port and then binds it: another process can take it in
        # between. Such a launch failure (not a training one) is worth one more try.
        if result.returncode != 0 and any(s in result.stderr for s in LAUNCH_FAILURES):
            result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                                    timeout=120)
    return result


def assert_close_weights(a_path: Path, b_path: Path) -> None:
    a, b = checkpoint.load(a_path)["model"], checkpoint.load(b_path)["model"]
    assert a.keys() == b.keys()  # in particular no `module.` prefix
    for key, value in a.items():
        torch.testing.assert_close(b[key], value, atol=1e-5, rtol=0, msg=key)


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_two_gloo_processes_match_one_and_resume(tiny_cfg, tmp_path):
    # grad_accum 2 exercises no_sync; lr_decay_iters fixes the schedule across max_iters. The two
    # differ only in the order of float sums (two half-batch means averaged vs one mean), which
    # AdamW's normalisation enlarges in near-zero gradient entries in proportion to the lr: at
    # lr 1e-2 a few weights move by up to ~4e-5, at 3e-3 all stay within ~2e-6. float32, since
    # bf16 (auto on an AMX CPU) rounds the two sums apart by far more than that.
    cfg = with_(tiny_cfg, optim={"lr": 3e-3, "min_lr": 3e-4, "lr_decay_iters": 12},
                train={"max_iters": 6, "batch_size": 8, "grad_accum": 2, "eval_interval": 3,
                       "log_interval": 3, "eval_iters": 2, "sample_chars": 0,
                       "dtype": "float32"})
    train(with_(cfg, train={"out_dir": str(tmp_path / "one6")}))
    train(with_(cfg, train={"out_dir": str(tmp_path / "one12"), "max_iters": 12}))

    run = tmp_path / "ddp"
    config = tmp_path / "ddp.yaml"
    save_config(with_(cfg, train={"out_dir": str(run)}), config)
    first = torchrun(["train", config], tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("done: 6 steps") == 1  # rank 0 alone prints
    assert_close_weights(tmp_path / "one6" / "last.pt", run / "last.pt")
    one, ddp = events(tmp_path / "one6"), events(run)
    assert [(e["event"], e["step"]) for e in ddp] == [(e["event"], e["step"]) for e in one]
    for a, b in zip(one, ddp, strict=True):  # the global batch's loss, eval averaged over ranks
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-5)
        assert b.get("val_loss", 0) == pytest.approx(a.get("val_loss", 0), abs=1e-5)

    resumed = torchrun(["train", "--out", run, "--resume", "--set", "train.max_iters=12"],
                       tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.count("done: 12 steps") == 1
    assert_close_weights(tmp_path / "one12" / "last.pt", run / "last.pt")
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 12


def test_a_failure_of_process_0_ends_the_others_without_a_traceback(tiny_cfg, tmp_path):
    """Rank 0 alone prepares the data and writes logs and checkpoints; when that fails, rank 1
    is told and ends quietly (it died in its next collective with gloo's "Connection closed by
    peer" traceback), so the error shows once: a missing data file, and a best.pt that cannot
    be written at the eval of a resumed run."""
    missing = torchrun(["train", ROOT / "configs" / "tiny.yaml", "--data", "missing.txt",
                        "--out", tmp_path / "none"], tmp_path)
    assert missing.returncode == 1  # torchrun's own code when a process fails
    assert [line for line in missing.stderr.splitlines() if line.startswith("error:")] == [
        "error: input file not found: missing.txt"]
    assert "[rank" not in missing.stderr  # no process's traceback

    cfg = with_(tiny_cfg, train={"max_iters": 2, "eval_interval": 2, "eval_iters": 1,
                                 "sample_chars": 0, "batch_size": 8, "dtype": "float32"})
    train(cfg)
    run = Path(cfg.train.out_dir)
    (run / "best.pt").unlink()
    (run / "best.pt").mkdir()  # the eval at step 4 improves, and cannot write best.pt
    failed = torchrun(["train", "--out", run, "--resume", "--set", "train.max_iters=4"], tmp_path)
    assert failed.returncode == 1
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: cannot write checkpoint {run / 'best.pt'}: Is a directory; the "
                      "previous best.pt, if any, is unchanged; free disk space (or fix the run "
                      "dir), then continue with --resume"]
    assert "[rank" not in failed.stderr
    assert checkpoint.load(run / "last.pt")["train_state"]["step"] == 2


def accumulation_probe(config: str) -> None:
    """Run in a child process by the test below: one train_step with grad_accum 3 under DDP in
    a gloo group of one rank; prints, as JSON, which micro-batches ran with DDP's gradient sync
    on and the gradient buckets all-reduced. The group lives and dies with that process: when
    this test brought it up and tore it down inside pytest's process, CI hung right after it."""
    from charlm.config.loading import load_config
    from charlm.data.datasets import dataset_for
    from charlm.model.gpt import GPT

    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        os.environ[key] = value
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                         world_size=1)
    cfg = load_config(config)
    data = dataset_for(cfg.data.path, cfg.data.val_fraction, Path(cfg.train.out_dir) / "data")
    model = GPT(cfg.model, len(data.vocab))
    dist = Dist(rank=0, world_size=1, active=True)
    ddp = dist.wrap(model, torch.device("cpu"))
    reduced, calls = [], []

    def count(state, bucket):  # a comm hook: called once per gradient bucket it all-reduces
        reduced.append(bucket.index())
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp.register_comm_hook(None, count)
    real_forward = GPT.forward

    def forward(self, *args, **kwargs):  # which micro-batches run with DDP's sync on
        calls.append(ddp.require_backward_grad_sync)
        return real_forward(self, *args, **kwargs)

    GPT.forward = forward
    sampler = BatchSampler(data.train, cfg.model.block_size, cfg.train.batch_size,
                           torch.device("cpu"), seed=0)
    optimizer = make_optimizer(model, cfg.optim)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    train_module.train_step(ddp, optimizer, scaler, sampler, cfg, torch.device("cpu"),
                            torch.float32, dist)
    print(json.dumps({"calls": calls, "reduced": reduced}), flush=True)
    os._exit(0)  # no teardown: the group ends with the process (charlm's own is tested above)


def test_gradient_accumulation_all_reduces_on_the_last_micro_batch_only(tiny_cfg, tmp_path):
    config = tmp_path / "accum.yaml"
    save_config(with_(tiny_cfg, train={"grad_accum": 3}), config)
    code = (f"from tests.integration.test_distributed import accumulation_probe as p; "
            f"p({str(config)!r})")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    probe = json.loads(result.stdout)
    assert probe["calls"] == [False, False, True]
    reduced = probe["reduced"]
    assert reduced and len(reduced) == len(set(reduced))  # each bucket once: one all-reduce


def test_an_encoder_decoder_trains_under_two_gloo_processes_as_in_one(tmp_path):
    """DDP for model.arch=encoder_decoder: the pair sampler's rows split each global batch, so
    two processes train as one does (up to the order of float sums)."""
    data = write_pairs(tmp_path / "reverse.tsv", reversal_pairs(200, 1))
    cfg = with_(pairs_config(data, tmp_path / "one", max_iters=4),
                optim={"lr": 3e-3, "min_lr": 3e-4, "warmup_iters": 2},
                train={"eval_interval": 2, "eval_pairs": 4, "sample_chars": 0,
                       "dtype": "float32"})
    train(cfg)
    run = tmp_path / "ddp"
    config = tmp_path / "ddp.yaml"
    save_config(with_(cfg, train={"out_dir": str(run)}), config)
    result = torchrun(["train", config], tmp_path)
    assert result.returncode == 0, result.stderr
    assert_close_weights(tmp_path / "one" / "last.pt", run / "last.pt")
    one, ddp = events(tmp_path / "one"), events(run)
    assert [(e["event"], e["step"]) for e in ddp] == [(e["event"], e["step"]) for e in one]
    # Each rank's loss is the mean over its own target units, and ranks average those means: with
    # padding, rows differ in length, so the val loss is close to one process's, not equal.
    for a, b in zip(one, ddp, strict=True):
        assert b.get("val_loss", 0) == pytest.approx(a.get("val_loss", 0), abs=1e-2)
