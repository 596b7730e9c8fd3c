"""The benchmark scripts of scripts/ that train or start processes: bad config as one line (for
time_to_loss.py, its `charlm train` child's), what a stopped script leaves behind, and the figures
of a short real run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, common_module, import_script

TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.mark.parametrize("name, args, message", [
    ("bench_train.py", ["missing.yaml"], "error: config file not found: missing.yaml"),
    ("bench_train.py", [TINY, "--set", "model.n_layr=2"], "did you mean 'n_layer'?"),
    ("bench_sample.py", ["--configs", "missing.yaml"], "error: config file not found"),
    ("bench_split.py", ["--configs", "missing.yaml"], "error: config file not found"),
    ("compare_variants.py", ["--config", TINY, "--eval-iters", "0"],
     "error: invalid config value train.eval_iters"),
    ("time_to_loss.py", ["missing.yaml"], "error: config file not found: missing.yaml"),
    ("time_to_loss.py", [TINY, "--set", "model.n_layr=2"], "did you mean 'n_layer'?"),
    ("cmudict_pairs.py", ["missing.dict"], "error: input file not found: missing.dict"),
])
def test_scripts_report_bad_config_in_one_line(run_script, name, args, message):
    result = run_script(name, *args)
    assert result.code == 2, result.err
    assert result.err.count("\n") == 1 and result.err.startswith("error: ")
    assert message in result.err and "Traceback" not in result.err


def test_time_to_loss_stopped_ends_its_training_run_and_removes_it(tmp_path, corpus):
    """SIGTERM to time_to_loss (a `timeout`, a scheduler) or Ctrl-C: the `charlm train` it
    launched used to train on, orphaned, into a temporary run dir left behind; now the run is
    stopped, its dir removed, and the script exits 143 without a traceback."""
    import signal
    import time
    from pathlib import Path

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)}
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "time_to_loss.py"), TINY,
         "--set", f"data.path={corpus}", "--set", "train.max_iters=100000"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def training() -> list[Path]:  # the processes of the run under `scratch`
        return [p for p in Path("/proc").iterdir() if p.name.isdigit()
                and str(scratch).encode() in (p / "cmdline").read_bytes()]
    try:
        deadline = time.monotonic() + 30
        while not list(scratch.glob("*/run/metrics.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert training(), "the run did not start"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        orphans = training()
        for p in orphans:  # without the fix: end the orphaned run
            os.kill(int(p.name), signal.SIGKILL)
    assert (proc.returncode, out, err) == (143, "", "")
    assert orphans == [] and list(scratch.glob("*/run")) == []


def test_time_to_loss_ends_a_run_at_max_seconds(monkeypatch, tmp_path):
    """A preset's fixed step count held a slow CPU for as long as it took; --max-seconds ends
    the run (here a stand-in that would sleep for a minute) and says that it did."""
    import time

    time_to_loss = import_script("time_to_loss", monkeypatch)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        t0 = time.perf_counter()
        curve, hit, cut = time_to_loss.watch(proc, tmp_path / "metrics.jsonl", 1.0, False, t0,
                                             max_seconds=0.2)
        assert (curve, hit, cut) == ([], None, True)
        assert proc.returncode == -15 and time.perf_counter() - t0 < 30
    finally:
        proc.kill()
        proc.wait()


def test_bench_prepare_stopped_removes_its_generated_file(tmp_path):
    """SIGTERM while bench_prepare writes its input left the file (up to --mb MB) in the temp
    dir; now the temp dir is removed and the script exits 143."""
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "bench_prepare.py"),
                             "--mb", "2000"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("*/big.txt")) and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (proc.returncode, out, err) == (143, "", "")
    assert list(tmp_path.glob("*/big.txt")) == []


def test_bench_train_leaves_no_files_and_reports_consistent_figures(monkeypatch, tmp_path,
                                                                    corpus, capsys):
    """Run from another directory, bench_train prepared the text into ./runs/.bench_dataset and
    left it there; now it prepares into a temporary dir. Its JSON holds the figures --help
    describes, each computed from the others as documented."""
    import json

    import charlm.runtime.precision

    bench_train = import_script("bench_train", monkeypatch)
    monkeypatch.setattr(bench_train, "cpu_peak", lambda dtype: (1e12, 64))  # no probes
    # float32 on any CPU
    monkeypatch.setattr(charlm.runtime.precision, "cpu_bf16_unit", lambda: None)
    work = tmp_path / "elsewhere"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "argv", ["bench_train.py", TINY, "--steps", "2", "--warmup", "1",
                                      "--set", f"data.path={corpus}"])
    bench_train.main()
    result = json.loads(capsys.readouterr().out)
    assert list(work.iterdir()) == []
    assert (result["config"], result["overrides"]) == (TINY, [f"data.path={corpus}"])
    assert result["machine"] == common_module(monkeypatch).machine_facts()
    assert (result["warmup_steps"], result["steps"], result["peak_dtype"]) == (1, 2, "float32")
    assert result["tokens_per_step"] == 16 * 16
    assert result["tokens_per_s"] == pytest.approx(256 / (result["ms_per_step"] / 1000), rel=0.01)
    assert result["peak_tflops"] == 1.0 and result["fp32_peak_tflops"] == 1.0
    assert result["mfu"] == result["mfu_vs_fp32_peak"] == pytest.approx(
        result["tokens_per_s"] * result["flops_per_token"] / 1e12, abs=1e-4)


def test_bench_train_stops_its_steps_after_seconds(monkeypatch, tmp_path, corpus, capsys):
    """--seconds bounds the warm-up and the timed steps on a CPU too slow for --steps: each
    stops once the time has passed, after one step at least, and the figures cover those."""
    import json

    bench_train = import_script("bench_train", monkeypatch)
    monkeypatch.setattr(bench_train, "cpu_peak", lambda dtype: (1e12, 64))
    monkeypatch.setattr(sys, "argv", ["bench_train.py", TINY, "--steps", "100000", "--warmup",
                                      "100000", "--seconds", "1e-9",
                                      "--set", f"data.path={corpus}"])
    bench_train.main()
    result = json.loads(capsys.readouterr().out)
    assert (result["warmup_steps"], result["steps"]) == (1, 1)
    assert result["tokens_per_s"] == pytest.approx(256 / (result["ms_per_step"] / 1000), rel=0.01)


def test_compare_variants_takes_a_configs_data_from_the_current_directory(monkeypatch, tmp_path,
                                                                          corpus, capsys):
    """A config's relative data.path is taken from the current directory, as `charlm train`
    and bench_train take it: compare_variants looked for it in the repository instead."""
    compare_variants = import_script("compare_variants", monkeypatch)
    config = tmp_path / "my.yaml"
    config.write_text((ROOT / "configs" / "tiny.yaml").read_text().replace(
        "data/tinyshakespeare.txt", corpus.name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["compare_variants.py", "--config", "my.yaml", "--seconds",
                                      "0.05", "--rounds", "1", "--eval-iters", "1", "--only",
                                      "default"])
    compare_variants.main()
    lines = capsys.readouterr().out.splitlines()
    common = common_module(monkeypatch)
    assert lines[0] == common.machine_line(common.machine_facts())
    rows = [line for line in lines if line.startswith("| default")]
    assert len(rows) == 1 and rows[0].endswith("| +0.000 |")
