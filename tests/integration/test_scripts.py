"""The benchmark harness for real: short training runs, child processes, what a stopped
benchmark leaves behind."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, bench, import_script, kind

TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.fixture
def float32_cpu(monkeypatch):
    """A CPU that computes float32 natively, whose peak is 1 TFLOP/s without a probe."""
    import charlm.runtime.profile

    monkeypatch.setattr(charlm.runtime.profile.Machine, "bf16_unit", lambda self: None)
    monkeypatch.setattr(import_script("benchlib.peak", monkeypatch), "cpu_peak",
                        lambda dtype: (1e12, 64))


def test_a_subcommand_imports_only_its_own_module():
    """--tree runs this checkout's harness on an older charlm: a subcommand that imported every
    other subcommand's module would fail on any name one of them imports and that tree lacks.
    A process of its own: importing benchlib again here would leave two copies of its modules."""
    code = ("import json, sys; sys.path.insert(0, 'scripts'); import bench; "
            "names = [b.name for b in bench.benches(['prepare', '--mb', '1'])]; "
            "print(json.dumps([names, sorted(sys.modules), bench.NAMES, "
            "[b.name for b in bench.benches(['--help'])]]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    names, loaded, all_names, listed = json.loads(done.stdout)
    assert names == ["prepare"] and "benchlib.prepare" in loaded
    assert not {f"benchlib.{name}" for name in all_names if name != "prepare"} & set(loaded)
    assert listed == all_names


def test_bench_train_reports_consistent_figures(monkeypatch, capsys, corpus, float32_cpu):
    """Each round's figures follow from one another as documented: tokens/s from ms a step and
    the tokens a step, MFU from tokens/s, FLOPs per token and the peak."""
    records, _ = bench(monkeypatch, capsys, "train", TINY, "--steps", "2", "--warmup", "1",
                       "--rounds", "2", "--set", f"data.path={corpus}")
    (setup,) = kind(records, "result")
    assert (setup["variant"], setup["warmup_steps"], setup["peak_dtype"]) == ("default", 1,
                                                                              "float32")
    assert setup["tokens_per_step"] == 16 * 16
    assert setup["peak_tflops"] == 1.0 and setup["fp32_peak_tflops"] == 1.0
    rounds = kind(records, "round")
    assert [(r["variant"], r["round"], r["steps"]) for r in rounds] == [("default", 1, 2),
                                                                       ("default", 2, 2)]
    for r in rounds:
        assert r["tokens_per_s"] == pytest.approx(256 / (r["ms_per_step"] / 1000), rel=0.01)
        assert r["mfu"] == r["mfu_vs_fp32_peak"] == pytest.approx(
            r["tokens_per_s"] * setup["flops_per_token"] / 1e12, abs=1e-4)
    (summary,) = kind(records, "summary")
    assert summary["ms_per_step"]["median"] == round(statistics.median(r["ms_per_step"]
                                                                       for r in rounds), 4)


def test_bench_train_stops_its_steps_after_seconds(monkeypatch, capsys, corpus, float32_cpu):
    """--seconds bounds the warm-up and each round on a CPU too slow for --steps: each stops
    once the time has passed, after one step at least, and the figures cover those."""
    records, _ = bench(monkeypatch, capsys, "train", TINY, "--steps", "100000", "--warmup",
                       "100000", "--seconds", "1e-9", "--rounds", "1",
                       "--set", f"data.path={corpus}")
    assert kind(records, "result")[0]["warmup_steps"] == 1
    (r,) = kind(records, "round")
    assert r["steps"] == 1
    assert r["tokens_per_s"] == pytest.approx(256 / (r["ms_per_step"] / 1000), rel=0.01)


def test_bench_train_variants_take_turns_on_a_configs_data_from_the_current_directory(
        monkeypatch, capsys, tmp_path, corpus, float32_cpu):
    """A config's relative data.path is taken from the current directory, as `charlm train`
    takes it; the variants train in turn, each round, and with --eval-iters end with their val
    loss after the same steps."""
    config = tmp_path / "my.yaml"
    config.write_text((ROOT / "configs" / "tiny.yaml").read_text().replace(
        "data/tinyshakespeare.txt", corpus.name))
    monkeypatch.chdir(tmp_path)
    records, err = bench(monkeypatch, capsys, "train", "my.yaml", "--variants", "default",
                         "activation=relu", "model.n_embd=16,model.n_head=1", "--steps", "1",
                         "--warmup", "0", "--rounds", "2", "--eval-iters", "1")
    names = ["default", "activation=relu", "model.n_embd=16,model.n_head=1"]
    assert [(r["variant"], r["round"]) for r in kind(records, "round")] == [
        (n, r) for r in (1, 2) for n in names]
    setups, evals = kind(records, "result")[:3], kind(records, "result")[3:]
    assert [s["params"] for s in setups][0] > setups[2]["params"]
    assert [(e["variant"], e["steps"]) for e in evals] == [(n, 2) for n in names]
    assert all(e["val_loss"] > 0 for e in evals)
    assert [s["variant"] for s in kind(records, "summary")] == names
    assert "| my.yaml | activation=relu | 2 | " in err


def test_time_to_loss_ends_a_run_at_max_seconds(monkeypatch, tmp_path):
    """A preset's fixed step count held a slow CPU for as long as it took; max_seconds ends
    the run (here a stand-in that would sleep for a minute) and says that it did."""
    loss = import_script("benchlib.loss", monkeypatch)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        t0 = time.perf_counter()
        curve, hit, cut = loss.watch(proc, tmp_path / "metrics.jsonl", 1.0, False, t0,
                                     max_seconds=0.2)
        assert (curve, hit, cut) == ([], None, True)
        assert proc.returncode == -15 and time.perf_counter() - t0 < 30
    finally:
        proc.kill()
        proc.wait()


def test_bench_prepare_peak_rss_is_the_childs_own(monkeypatch, tmp_path):
    """A child forked from a process with torch imported reported that process's 240 MB as its
    own peak (Linux keeps the high-water mark across exec); it is started from a small
    interpreter instead, so an empty Python reports what it uses."""
    prepare = import_script("benchlib.prepare", monkeypatch)
    seconds, rss = prepare.run_child([sys.executable, "-c", "pass"], tmp_path)
    assert 0 < seconds < 30 and 1 < rss < 60


@pytest.mark.parametrize("argv", [
    ["decode", "--configs", TINY, "--tokens", "2", "--rounds", "1"],
    ["train", TINY, "--steps", "1", "--warmup", "0", "--rounds", "1", "--eval-iters", "1",
     "--set", "data.path=CORPUS"],
    ["presets", TINY, "--target", "9", "--set", "train.max_iters=2", "--set",
     "train.eval_interval=2", "--set", "data.path=CORPUS"],
    ["prepare", "--mb", "1"],
])
def test_a_bench_leaves_no_files_behind(monkeypatch, capsys, tmp_path, corpus, float32_cpu,
                                        argv):
    """Run from another directory, bench_train prepared its text into ./runs/.bench_dataset and
    left it there: every subcommand works in temporary directories it removes."""
    work, scratch = tmp_path / "elsewhere", tmp_path / "tmp"
    work.mkdir()
    scratch.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    records, _ = bench(monkeypatch, capsys, *[a.replace("CORPUS", str(corpus)) for a in argv])
    assert kind(records, "round") and kind(records, "summary")
    assert list(work.iterdir()) == [] and list(scratch.iterdir()) == []


def stop_when(proc: subprocess.Popen, ready, timeout: float = 60) -> tuple[str, str]:
    """SIGTERM to `proc` once `ready()`; its stdout and stderr."""
    try:
        deadline = time.monotonic() + timeout
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready(), "it did not get that far"
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_bench_presets_stopped_ends_its_training_run_and_removes_it(tmp_path, corpus):
    """SIGTERM to the benchmark (a `timeout`, a scheduler) or Ctrl-C: the `charlm train` it
    launched used to train on, orphaned, into a temporary run dir left behind; now the run is
    stopped, its dir removed, and the script exits 143 without a traceback."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "presets", TINY, "--target", "0.1",
         "--set", f"data.path={corpus}", "--set", "train.max_iters=100000"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def training() -> list[Path]:  # the processes of the run under `scratch`
        return [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and str(scratch).encode() in (p / "cmdline").read_bytes()]
    try:
        out, err = stop_when(proc, lambda: list(scratch.glob("*/run/metrics.jsonl")))
    finally:
        orphans = training()
        for p in orphans:  # without the fix: end the orphaned run
            os.kill(int(p.name), signal.SIGKILL)
    assert proc.returncode == 143 and "Traceback" not in err
    assert [json.loads(line)["kind"] for line in out.splitlines()] == ["machine"]
    assert orphans == [] and list(scratch.iterdir()) == []


def test_bench_prepare_stopped_removes_its_generated_file(tmp_path):
    """SIGTERM while the prepare benchmark writes its input left the file (up to --mb MB) in
    the temp dir; now the temp dir is removed and the script exits 143."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "bench.py"), "prepare",
                             "--mb", "2000"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = stop_when(proc, lambda: list(tmp_path.glob("*/big.txt")))
    assert proc.returncode == 143 and "Traceback" not in err
    assert [json.loads(line)["kind"] for line in out.splitlines()] == ["machine"]
    assert list(tmp_path.iterdir()) == []


def test_bench_nanogpt_score_is_its_kept_models_mean_over_the_val_windows(monkeypatch, tmp_path):
    """`score` loads the ckpt.pt nanoGPT's run kept, with the `_orig_mod.` prefix of a compiled
    model taken off, and averages its loss over val.bin in windows of block_size end to end (a
    stand-in model whose loss is its targets' mean id, so the figure is the mean of ids 1..n*64)."""
    import numpy as np

    presets = import_script("benchlib.presets", monkeypatch)
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "model.py").write_text(
        "import torch\nfrom dataclasses import dataclass\n"
        "@dataclass\nclass GPTConfig:\n    block_size: int\n"
        "class GPT(torch.nn.Module):\n"
        "    def __init__(self, cfg):\n        super().__init__()\n"
        "        self.w = torch.nn.Parameter(torch.zeros(1))\n"
        "    def forward(self, x, y):\n"
        "        assert x.shape[1] == 64 and (y[:, :-1] == x[:, 1:]).all()\n"
        "        return None, y.double().mean() + self.w\n")
    (tmp_path / "train.py").write_text(
        "import os, torch\nos.makedirs('out-shakespeare-char')\n"
        "torch.save({'model_args': {'block_size': 64},\n"
        "            'model': {'_orig_mod.w': torch.zeros(1)}}, 'out-shakespeare-char/ckpt.pt')\n"
        "print('step 250: train loss 1.9000, val loss 1.8857')\n")
    val = np.random.default_rng(0).integers(0, 65, size=64 * 300 + 10, dtype=np.uint16)
    monkeypatch.setattr(presets, "nanogpt_data", lambda dest, text: val.tofile(dest / "val.bin"))
    result = presets.run_nanogpt(tmp_path, score=True)
    assert result["full_val"] == round(float(val[1:64 * 300 + 1].astype(np.float64).mean()), 4)
    assert presets.run_nanogpt(tmp_path)["full_val"] is None
