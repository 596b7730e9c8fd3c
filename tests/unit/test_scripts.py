"""The benchmark scripts in scripts/, in this process: bad input ends with one line on stderr and
exit code 2, and the figures they report are computed right."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import ROOT, common_module, import_script, write

TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.mark.parametrize("name, args", [
    ("bench_train.py", [TINY, "--steps", "0"]),
    ("bench_sample.py", ["--tokens", "0"]),
    ("bench_split.py", ["--pairs", "0"]),
    ("compare_variants.py", ["--seconds", "0"]),
    ("compare_variants.py", ["--rounds", "0"]),
    ("bench_prepare.py", ["--mb", "0"]),
    ("time_to_loss.py", ["--target", "0"]),
    ("time_to_loss.py", ["--at", "0"]),
    ("bench_g2p.py", ["--minutes", "0"]),
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


def test_cmudict_script_writes_pairs(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import cmudict_pairs

    src = write(tmp_path / "mini.dict", (
        ";;; a comment line\n"
        "# another comment\n"
        "abbe AE1 B IY0\n"
        "abbe(2) AE1 B\n"
        "abbe(3) AE0 B IY2 # stress only differs from the first\n"
        "\n"
        "d'artagnan D AH0 R T AE1 NG Y AH0 N # foreign french\n"
    ))
    out = tmp_path / "out.tsv"
    monkeypatch.setattr(sys, "argv", ["cmudict_pairs.py", str(src), "--out", str(out)])
    cmudict_pairs.main()
    assert out.read_text(encoding="utf-8") == (
        "abbe\tAE B IY\n"
        "abbe\tAE B\n"
        "d'artagnan\tD AH R T AE NG Y AH N\n")
    assert capsys.readouterr().out == f"wrote 3 pairs of 2 words to {out}\n"
    monkeypatch.setattr(sys, "argv", ["cmudict_pairs.py", str(src), "--out", str(out),
                                      "--keep-stress"])
    cmudict_pairs.main()
    assert out.read_text(encoding="utf-8").splitlines()[:3] == [
        "abbe\tAE1 B IY0", "abbe\tAE1 B", "abbe\tAE0 B IY2"]
