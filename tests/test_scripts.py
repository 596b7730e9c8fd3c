"""The benchmark scripts in scripts/: bad input ends with one line on stderr and exit code 2, and
the figures they report are computed right."""

from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from .conftest import ROOT, CliResult, run_main

TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.fixture
def run_script(monkeypatch, capsys):
    """Run a script of scripts/ as `python scripts/NAME ARGS` would, in this process: the
    refusals tested with it end before any work, and a child process would spend 3 s of each
    test importing torch again. An exception that escapes the script fails the test, as its
    traceback would fail the command's; the SIGTERM handler the script sets is put back."""
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # the scripts import `common` by name

    def run(name: str, *args: str) -> CliResult:
        path = ROOT / "scripts" / name
        monkeypatch.setattr(sys, "argv", [str(path), *args])
        handler = signal.getsignal(signal.SIGTERM)
        try:
            return run_main(capsys, lambda: runpy.run_path(str(path), run_name="__main__"))
        finally:
            signal.signal(signal.SIGTERM, handler)

    return run


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


@pytest.mark.parametrize("name, args", [
    ("bench_train.py", [TINY, "--steps", "0"]),
    ("bench_sample.py", ["--tokens", "0"]),
    ("bench_split.py", ["--pairs", "0"]),
    ("compare_variants.py", ["--seconds", "0"]),
    ("compare_variants.py", ["--rounds", "0"]),
    ("bench_prepare.py", ["--mb", "0"]),
    ("time_to_loss.py", ["--target", "0"]),
    ("time_to_loss.py", ["--at", "0"]),
    ("experiments/g2p_cmudict.py", ["--minutes", "0"]),
    ("experiments/tune_vs_grid.py", ["--seeds", "0"]),
    ("bench_presets.py", ["--skip-nanogpt", "0"]),
])
def test_scripts_reject_counts_that_are_not_positive(run_script, name, args):
    result = run_script(name, *args)
    assert result.code == 2
    assert "must be greater than 0, got 0" in result.err and "Traceback" not in result.err


def test_bench_train_rejects_a_negative_warmup(run_script):
    """--warmup -5 ran no warm-up, as 0 would, without a word; --warmup 0 is allowed."""
    result = run_script("bench_train.py", TINY, "--warmup", "-5")
    assert result.code == 2 and result.out == ""
    assert "argument --warmup: must be at least 0, got -5" in result.err


@pytest.mark.parametrize("value", ["nan", "-1"])
def test_time_to_loss_rejects_a_target_no_loss_can_reach(run_script, value):
    """A loss is positive: --target -1 would never be reached, and --target nan never compared
    true and was printed as NaN, which is not JSON. Both are refused before any training."""
    result = run_script("time_to_loss.py", TINY, "--target", value)
    assert result.code == 2 and result.out == ""
    assert f"argument --target: must be greater than 0, got {value}" in result.err


@pytest.mark.parametrize("name, description", [
    ("time_to_loss.py", "Time to a validation loss: run `charlm train CONFIG` and report the wall "
     "time, from the launch of the command, at which the val loss first reached --target, with "
     "the val curve."),
    ("bench_prepare.py", "Benchmark `charlm prepare`: MB/s and peak RSS on a generated text file "
     "(default 200 MB)."),
])
def test_script_help_describes_in_whole_sentences(run_script, name, description):
    """--help shows the docstring's first paragraph, not its first line cut mid-sentence."""
    result = run_script(name, "--help")
    assert result.code == 0, result.err
    assert description in " ".join(result.out.split())


def test_bench_presets_needs_a_nanogpt_clone(run_script, tmp_path):
    result = run_script("bench_presets.py", "--nanogpt", str(tmp_path))
    assert result.code == 2 and result.out == ""
    assert result.err.endswith("error: --nanogpt must name a clone of karpathy/nanoGPT (or "
                                  "give --skip-nanogpt)\n")


def test_bench_presets_refuses_a_bad_set_before_nanogpt_runs(run_script, tmp_path):
    (tmp_path / "train.py").write_text("raise SystemExit('nanoGPT must not run')\n")
    result = run_script("bench_presets.py", "--nanogpt", str(tmp_path),
                        "--set", "train.dtyp=float32")
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith("error: ") and result.err.count("\n") == 1
    assert "did you mean 'dtype'?" in result.err


def test_bench_presets_hands_its_overrides_to_each_preset(monkeypatch, capsys):
    """--set reaches time_to_loss.py for both presets, and the table says it was given."""
    script = import_script("bench_presets", monkeypatch)
    commands = []

    def fake_run(command, **kw):
        commands.append(command)
        line = json.dumps({"machine": {}, "time_to_target_s": 50.0})
        return subprocess.CompletedProcess(command, 0, stdout=line + "\n", stderr="")

    monkeypatch.setattr(script.subprocess, "run", fake_run)
    monkeypatch.setattr(sys, "argv", ["bench_presets.py", "--skip-nanogpt", "200", "--set",
                                      "train.dtype=float32", "--set", "train.seed=3"])
    script.main()
    assert [c[2] for c in commands] == [str(ROOT / c) for c, _, _ in script.PRESETS]
    assert all(c[-4:] == ["--set", "train.dtype=float32", "--set", "train.seed=3"]
               for c in commands)
    out = capsys.readouterr().out
    assert "both presets with --set train.dtype=float32 --set train.seed=3" in out
    assert "| shakespeare_char_cpu.yaml | 1.88 | 50.0 s | 0.25x | <= 0.25x |" in out


def test_bench_presets_writes_nanogpts_data_as_its_prepare_does(monkeypatch, tmp_path):
    """nanoGPT's shakespeare_char/prepare.py: ids of the sorted characters as uint16, the first
    90 % of the text in train.bin, the rest in val.bin, and meta.pkl with the vocabulary."""
    import pickle

    import numpy as np

    script = import_script("bench_presets", monkeypatch)
    monkeypatch.setattr(script, "TEXT", tmp_path / "input.txt")
    (tmp_path / "input.txt").write_text("hello world\n" * 5, encoding="utf-8")
    script.nanogpt_data(tmp_path)
    meta = pickle.loads((tmp_path / "meta.pkl").read_bytes())
    assert meta["itos"] == dict(enumerate(sorted(set("hello world\n"))))
    assert meta["vocab_size"] == 9 and meta["stoi"]["h"] == 4  # "\n", " ", d, e, h, ...
    ids = np.concatenate([np.fromfile(tmp_path / f, dtype=np.uint16)
                          for f in ("train.bin", "val.bin")])
    assert "".join(meta["itos"][i] for i in ids) == "hello world\n" * 5
    assert len(np.fromfile(tmp_path / "train.bin", dtype=np.uint16)) == int(60 * 0.9)


def import_script(name: str, monkeypatch):
    """A script of scripts/ as a module (they import their neighbour `common` by name)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    return importlib.import_module(name)


def test_bench_decode_times_its_measures_in_turn_and_pairs_them_by_round(monkeypatch):
    """Every round times each measure once, back to back, after one warm-up call each; a
    ratio is the median of the rounds' own ratios, not of the best rates, which may come from
    rounds far apart on a machine whose speed jumps."""
    script = import_script("bench_decode", monkeypatch)
    calls, clock = [], iter(range(1000))
    # the script's own clock only: the time module stays the same for everything else
    monkeypatch.setattr(script, "time", SimpleNamespace(perf_counter=lambda: next(clock) * 0.5))

    def runner(name, tokens):
        return (lambda: calls.append(name)), tokens

    rates = script.rounds({"a": runner("a", 10), "b": runner("b", 5)}, 3)
    assert calls == ["a", "b"] * 4
    assert rates == {"a": [20.0] * 3, "b": [10.0] * 3}  # each call took one tick, 0.5 s
    rates = {"a": [100.0, 60.0, 45.0], "b": [40.0, 50.0, 100.0]}
    assert script.ratio(rates, "a", "b") == 1.2  # rounds: 2.5, 1.2, 0.45; best rates: 1.0


@pytest.mark.parametrize("device_name, peak, key", [
    ("NVIDIA H100 80GB HBM3", 989e12, "H100"),
    ("NVIDIA H100 PCIe", 756e12, "H100 PCIe"),
    ("NVIDIA H100 NVL", 835e12, "H100 NVL"),
    ("NVIDIA H200", 989e12, "H200"),
    ("NVIDIA H200 NVL", 835e12, "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", 312e12, "A100"),
    ("NVIDIA A100 80GB PCIe", 312e12, "A100"),
])
def test_bench_train_gpu_peak_is_the_cards_own(monkeypatch, device_name, peak, key):
    """MFU divides by the peak of the card at hand: an H100 PCIe (114 SMs) or NVL peaks lower
    than the SXM part, whose 989 TFLOP/s would understate their MFU."""
    bench_train = import_script("bench_train", monkeypatch)
    assert bench_train.gpu_peak(device_name) == (peak, f"{key} bf16 dense (table)")


def test_bench_train_gpu_peak_of_an_unknown_card_is_none(monkeypatch):
    bench_train = import_script("bench_train", monkeypatch)
    assert bench_train.gpu_peak("NVIDIA L4") == (None, "NVIDIA L4: not in the table")


def test_bench_prepare_peak_rss_is_in_mb_like_the_input(monkeypatch):
    """peak_rss_mb is in MB (10^6 bytes) as input_mb and mb_per_s are, not in MiB: Linux's
    ru_maxrss of 1,000,000 KiB is 1024 MB."""
    bench_prepare = import_script("bench_prepare", monkeypatch)
    monkeypatch.setattr(bench_prepare.sys, "platform", "linux")
    assert bench_prepare.maxrss_mb(1_000_000) == 1024.0
    monkeypatch.setattr(bench_prepare.sys, "platform", "darwin")  # bytes there
    assert bench_prepare.maxrss_mb(5_000_000) == 5.0


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


@pytest.mark.parametrize("unit, dtype, source", [
    ("AMX", torch.bfloat16, "cpu bfloat16 512^3 matmul probe, best of 3"),
    ("AVX512_BF16", torch.bfloat16, "cpu bfloat16 512^3 matmul probe, best of 3"),
    (None, torch.float32, "cpu float32 512^3 matmul probe, best of 3"),
])
def test_bench_train_probes_the_dtype_charlms_auto_picks(monkeypatch, unit, dtype, source):
    """The peak is probed in the dtype `dtype: auto` trains in on this CPU: bf16 without AMX or
    AVX512_BF16 is emulated, and its 2048^3 probe alone took more than ten minutes on a 2-core
    AVX2 EPYC."""
    import charlm.runtime.precision

    bench_train = import_script("bench_train", monkeypatch)
    probed = []
    monkeypatch.setattr(charlm.runtime.precision, "cpu_bf16_unit", lambda: unit)
    monkeypatch.setattr(bench_train, "cpu_peak", lambda d: probed.append(d) or (1e12, 512))
    assert bench_train.device_peak(torch.device("cpu")) == (1e12, dtype, source)
    assert probed == [dtype]


@pytest.mark.parametrize("unit_s, n", [(0.2 / 512**3, 512), (10.0 / 256**3, 256)])
def test_bench_train_probe_grows_until_a_matmul_takes_a_fifth_of_a_second(monkeypatch, unit_s,
                                                                         n):
    """The probe's size follows the CPU's speed: it grows from 256 until one matmul takes about
    0.2 s (here n^3 * unit_s, a clock standing in for the CPU), and a CPU slower than that at
    256 is probed at 256, not at a size that runs for minutes."""
    bench_train = import_script("bench_train", monkeypatch)
    monkeypatch.setattr(bench_train, "matmul_seconds", lambda a, b: a.shape[0] ** 3 * unit_s)
    peak, size = bench_train.cpu_peak(torch.float32)
    assert size == n and peak == pytest.approx(2 / unit_s)


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


def test_bench_sample_stops_each_path_after_its_seconds(monkeypatch, capsys):
    """The cached pass had no time limit: on the busy EPYC the baby GPT decodes about 10
    tokens a second, so each of its 2000-token cached runs took minutes. Each path now stops
    after its own limit, and the table marks a path cut short with the tokens it covers."""
    import json

    bench_sample = import_script("bench_sample", monkeypatch)
    monkeypatch.setattr(sys, "argv", ["bench_sample.py", "--configs", TINY, "--batches", "1",
                                      "--tokens", "50", "--cached-seconds", "1e-9",
                                      "--uncached-seconds", "1e-9"])
    bench_sample.main()
    lines = capsys.readouterr().out.splitlines()
    common = common_module(monkeypatch)
    assert lines[0] == common.machine_line(common.machine_facts())
    row = json.loads(lines[1])
    assert (row["cached_tokens_measured"], row["uncached_tokens_measured"]) == (1, 1)
    assert lines[-1].startswith("| tiny.yaml | ") and lines[-1].count("(first 1)") == 2


def test_bench_split_pairs_the_two_rules_on_the_same_tokens(monkeypatch, capsys):
    """Each pair decodes with every product split and with the rule, which must agree on the
    tokens; the rule is restored after each decode."""
    import json

    from charlm.model import layers

    bench_split = import_script("bench_split", monkeypatch)
    rules = []
    real = bench_split.decode

    def spy(model, batch, tokens, split_min):
        rules.append(split_min)
        return real(model, batch, tokens, split_min)

    monkeypatch.setattr(bench_split, "decode", spy)
    monkeypatch.setattr(sys, "argv", ["bench_split.py", "--configs", TINY, "--batches", "2",
                                      "--pairs", "2", "--tokens", "5"])
    bench_split.main()
    lines = capsys.readouterr().out.splitlines()
    assert rules == [0, layers.SPLIT_MIN_WEIGHTS] * 2 and layers.SPLIT_MIN_WEIGHTS == 1 << 17
    row = json.loads(lines[1])
    assert (row["config"], row["batch"], row["pairs"], row["tokens"]) == ("tiny.yaml", 2, 2, 5)
    assert lines[-1].startswith("| tiny.yaml | 2 | ")


def common_module(monkeypatch):
    return import_script("common", monkeypatch)


@pytest.mark.parametrize("unit", ["AMX", "AVX512_BF16", None])
def test_machine_facts_name_the_cpu_and_what_it_computes_natively(monkeypatch, unit):
    """Every script prints these with its figures: a figure without its machine cannot be
    compared. bf16 is native exactly where charlm's `dtype: auto` trains in it."""
    import charlm.runtime.precision

    common = common_module(monkeypatch)
    monkeypatch.setattr(charlm.runtime.precision, "cpu_bf16_unit", lambda: unit)
    monkeypatch.setattr(common, "cpu_model", lambda: "Test CPU 9000")
    facts = common.machine_facts()
    assert list(facts) == ["cpu", "logical_cores", "torch_threads", "torch", "cpu_capability",
                           "bf16_unit", "gpu"]
    assert facts["cpu"] == "Test CPU 9000" and facts["bf16_unit"] == unit
    assert facts["torch"] == torch.__version__ and facts["logical_cores"] == os.cpu_count()
    assert common.cpu_native_dtype() == (torch.bfloat16 if unit else torch.float32)
    line = common.machine_line(facts)
    assert line.startswith(f"machine: Test CPU 9000, {os.cpu_count()} logical cores, "
                           f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, "
                           f"{torch.backends.cpu.get_cpu_capability()}, ")
    assert line.endswith(f"bf16 native ({unit})" if unit else "float32 native (bf16 emulated)")


def test_cpu_model_reads_cpuinfo_else_asks_platform(monkeypatch, tmp_path):
    common = common_module(monkeypatch)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                       "model name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2\n")
    assert common.cpu_model(cpuinfo) == "AMD EPYC 7B12"
    monkeypatch.setattr(common.platform, "processor", lambda: "arm")
    assert common.cpu_model(tmp_path / "missing") == "arm"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 48.00\n")  # an ARM board's cpuinfo
    assert common.cpu_model(cpuinfo) == "arm"


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
