"""The scripts in scripts/: the benchmark harness (`bench.py` and `benchlib`) times its variants
in interleaved rounds and reports them as it documents (JSON lines, statistics, paired ratios),
its figures are computed right, bad input to any script ends with one line on stderr and exit
code 2, and a stopped or finished benchmark leaves no files behind."""

from __future__ import annotations

import importlib
import io
import json
import os
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def script_module(name: str, monkeypatch):
    """A module of scripts/ (`bench`, `benchlib.train`, `common`): they import each other by
    name, from scripts/."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    return importlib.import_module(name)


def bench(monkeypatch, capsys, *argv: str) -> tuple[list[dict], str]:
    """`python scripts/bench.py ARGV` in this process: its JSON lines and its stderr."""
    script_module("bench", monkeypatch).main(list(argv))
    captured = capsys.readouterr()
    return [json.loads(line) for line in captured.out.splitlines()], captured.err


def kind(records: list[dict], name: str) -> list[dict]:
    return [r for r in records if r["kind"] == name]


# --- bad input: one line, exit code 2 -------------------------------------------------------

@pytest.mark.parametrize("name, args, message", [
    ("bench.py", ["train", "missing.yaml"], "error: config file not found: missing.yaml"),
    ("bench.py", ["train", TINY, "--set", "model.n_layr=2"], "did you mean 'n_layer'?"),
    ("bench.py", ["train", TINY, "--set", "data.path=missing.txt"],
     "error: input file not found: missing.txt"),
    ("bench.py", ["train", TINY, "--variants", "swiglu"],
     "error: variant 'swiglu' is neither one of default, pos_encoding=sinusoidal"),
    ("bench.py", ["decode", "--configs", "missing.yaml"], "error: config file not found"),
    ("bench.py", ["decode", "--configs", TINY, "--variants", "cached", "transformers"],
     "transformers' GPT-2 decodes no further than its block_size (16) where charlm slides its "
     "window; give --tokens 15 or fewer"),
    ("bench.py", ["decode", "--configs", TINY, "--tree", "no-such-rev"],
     "error: --tree no-such-rev: neither a directory nor a commit of"),
    ("bench.py", ["presets", "missing.yaml", "--target", "1.9"],
     "error: config file not found: missing.yaml"),
    ("bench.py", ["presets", TINY, "--target", "2", "--set", "model.n_layr=2"],
     "did you mean 'n_layer'?"),
    ("bench.py", ["presets", TINY], "has no target val loss of its own; give --target"),
    ("cmudict_pairs.py", ["missing.dict"], "error: input file not found: missing.dict"),
])
def test_scripts_report_bad_input_in_one_line(run_script, name, args, message):
    """Said before anything is measured or printed: no machine line, no half a table."""
    result = run_script(name, *args)
    assert result.code == 2, result.err
    assert result.out == "" and result.err.count("\n") == 1 and result.err.startswith("error: ")
    assert message in result.err and "Traceback" not in result.err


@pytest.mark.parametrize("name, args", [
    ("bench.py", ["train", TINY, "--steps", "0"]),
    ("bench.py", ["train", TINY, "--rounds", "0"]),
    ("bench.py", ["decode", "--tokens", "0"]),
    ("bench.py", ["decode", "--seconds", "0"]),
    ("bench.py", ["prepare", "--mb", "0"]),
    ("bench.py", ["presets", "--target", "0"]),
    ("bench.py", ["presets", "--nanogpt-seconds", "0"]),
    ("bench.py", ["presets", "--max-seconds", "0"]),
    ("experiments/g2p_cmudict.py", ["--minutes", "0"]),
    ("experiments/tune_vs_grid.py", ["--seeds", "0"]),
])
def test_scripts_reject_counts_that_are_not_positive(run_script, name, args):
    result = run_script(name, *args)
    assert result.code == 2
    assert "must be greater than 0, got 0" in result.err and "Traceback" not in result.err


def test_bench_train_rejects_a_negative_warmup(run_script):
    """--warmup -5 ran no warm-up, as 0 would, without a word; --warmup 0 is allowed."""
    result = run_script("bench.py", "train", TINY, "--warmup", "-5")
    assert result.code == 2 and result.out == ""
    assert "argument --warmup: must be at least 0, got -5" in result.err


@pytest.mark.parametrize("value", ["nan", "-1"])
def test_bench_presets_rejects_a_target_no_loss_can_reach(run_script, value):
    """A loss is positive: --target -1 would never be reached, and --target nan never compared
    true and was printed as NaN, which is not JSON. Both are refused before any training."""
    result = run_script("bench.py", "presets", TINY, "--target", value)
    assert result.code == 2 and result.out == ""
    assert f"argument --target: must be greater than 0, got {value}" in result.err


@pytest.mark.parametrize("name, args, description", [
    ("bench.py", [], "charlm's benchmarks, one harness: `decode`, `train`, `presets` and "
     "`prepare` time their variants in interleaved rounds (A B A B ...) and report them alike."),
    ("experiments/g2p_cmudict.py", [], "G2P on CMUdict in a fixed wall time: the "
     "encoder-decoder (configs/g2p_cmudict.yaml) against a decoder-only GPT"),
])
def test_script_help_describes_in_whole_sentences(run_script, name, args, description):
    """--help shows the docstring's first paragraph, not its first line cut mid-sentence."""
    result = run_script(name, *args, "--help")
    assert result.code == 0, result.err
    assert description in " ".join(result.out.split())


# --- the harness ----------------------------------------------------------------------------

def test_interleave_runs_every_variant_once_a_round_in_turn_after_its_warmup(monkeypatch):
    harness = script_module("benchlib.harness", monkeypatch)
    calls = []

    def runner(name):
        return lambda: calls.append(name) or {"value": len(calls)}

    figures = list(harness.interleave({"a": runner("a"), "b": runner("b")}, 3, warmup=1))
    assert calls == ["a", "b"] * 4  # the warm-up round, then three: A B A B, not A A A B B B
    assert [(f["variant"], f["round"], f["value"]) for f in figures] == [
        ("a", 1, 3), ("b", 1, 4), ("a", 2, 5), ("b", 2, 6), ("a", 3, 7), ("b", 3, 8)]


def test_summaries_give_stats_over_rounds_and_ratios_paired_by_round(monkeypatch):
    """A ratio is the median of the rounds' own ratios, not of the best rates, which may come
    from rounds far apart on a machine whose speed jumps; a round without a figure (a target
    not reached) drops out of the statistics."""
    harness = script_module("benchlib.harness", monkeypatch)
    rates = {"b": [40.0, 50.0, 100.0], "a": [100.0, 60.0, 45.0]}
    figures = [{"config": "x", "variant": v, "round": r + 1, "rate": rates[v][r], "ms": 1.0}
               for r in range(3) for v in ("b", "a")]
    figures.append({"config": "y", "variant": "b", "round": 1, "rate": None, "ms": 2.0})
    b, a, y = harness.summaries(figures, ("config",), "rate", ("ms",))
    assert b == {"config": "x", "variant": "b", "rounds": 3, "ms": harness.stats([1.0] * 3),
                 "rate": {"min": 40.0, "median": 50.0, "max": 100.0, "n": 3}}
    assert a["rate"] == {"min": 45.0, "median": 60.0, "max": 100.0, "n": 3}
    # rounds: 2.5, 1.2, 0.45; the best rates' ratio would say 1.0
    assert a["vs_b"] == {"min": 0.45, "median": 1.2, "max": 2.5, "n": 3}
    assert "vs_a" not in b and (y["rounds"], y["rate"]) == (1, None)
    assert harness.stats([3.0, None, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0,
                                                    "n": 3}
    assert harness.stats([None]) is None


def test_report_writes_the_machine_rounds_results_and_summaries_as_json_lines(monkeypatch):
    harness = script_module("benchlib.harness", monkeypatch)
    common = script_module("common", monkeypatch)
    fake = harness.Bench("fake", "A fake.", lambda p: None, lambda a: [], case=("config",),
                         metric="rate")
    figures = [{"config": "x", "variant": "base", "round": 1, "rate": 10.0},
               {"config": "x", "variant": "new", "round": 1, "rate": 15.0},
               {"config": "x", "variant": "base", "round": 2, "rate": 20.0},
               {"config": "x", "variant": "new", "round": 2, "rate": 20.0},
               {"config": "x", "params": 123}]
    out, err = io.StringIO(), io.StringIO()
    harness.report(fake, iter(figures), ["fake", "--rounds", "2"], out, err)
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["kind"] for r in records] == ["machine"] + ["round"] * 4 + ["result", "summary",
                                                                          "summary"]
    assert all(r["bench"] == "fake" for r in records)
    machine = records[0]
    assert machine["command"] == "python scripts/bench.py fake --rounds 2"
    assert set(machine) >= {"commit", "dirty", *common.machine_facts()}
    assert records[1] == {"kind": "round", "bench": "fake", **figures[0]}
    assert records[5] == {"kind": "result", "bench": "fake", "config": "x", "params": 123}
    assert records[7]["vs_base"] == {"min": 1.0, "median": 1.25, "max": 1.5, "n": 2}
    lines = err.getvalue().splitlines()
    assert lines[0] == common.machine_line(common.machine_facts())
    assert lines[1] == "round 1, x base: 10.0 rate"
    assert lines[-1] == "| x | new | 2 | 17.5 (15.0-20.0) | 1.25x (1-1.5) |"


def test_trees_run_one_child_each_in_turn_every_round(monkeypatch, tmp_path):
    """--tree A --tree B: round 1 runs A then B, round 2 A then B, each child one round of the
    same subcommand without --tree; the variants are named after their tree, and a child's
    results are taken once."""
    trees = script_module("benchlib.trees", monkeypatch)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    calls = []

    def child(tree: Path, argv: list[str]) -> list[dict]:
        calls.append((tree.name, argv))
        return [{"kind": "machine", "bench": "decode"},
                {"kind": "result", "bench": "decode", "variant": "x", "params": 1},
                {"kind": "round", "bench": "decode", "variant": "x", "round": 1, "rate": 1.0}]

    argv = ["decode", "--tree", str(tmp_path / "a"), "--tokens", "5", f"--tree={tmp_path / 'b'}"]
    figures = list(trees.tree_figures(argv, [str(tmp_path / "a"), str(tmp_path / "b")], 2,
                                      child))
    assert calls == [(name, ["decode", "--tokens", "5", "--rounds", "1"]) for name in "abab"]
    a, b = f"{tmp_path / 'a'}:x", f"{tmp_path / 'b'}:x"
    assert [(f["variant"], f.get("round")) for f in figures] == [
        (a, None), (a, 1), (b, None), (b, 1), (a, 2), (b, 2)]


def test_a_revision_tree_is_exported_and_removed(monkeypatch):
    trees = script_module("benchlib.trees", monkeypatch)
    with trees.checkouts(["HEAD"]) as paths:
        tree = paths["HEAD"]
        assert (tree / "charlm" / "__init__.py").is_file() and tree != ROOT
    assert not tree.exists()


# --- train ----------------------------------------------------------------------------------

@pytest.mark.parametrize("device_name, peak, key", [
    ("NVIDIA H100 80GB HBM3", 989e12, "H100"),
    ("NVIDIA H100 PCIe", 756e12, "H100 PCIe"),
    ("NVIDIA H100 NVL", 835e12, "H100 NVL"),
    ("NVIDIA H200", 989e12, "H200"),
    ("NVIDIA H200 NVL", 835e12, "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", 312e12, "A100"),
    ("NVIDIA A100 80GB PCIe", 312e12, "A100"),
])
def test_gpu_peak_is_the_cards_own(monkeypatch, device_name, peak, key):
    """MFU divides by the peak of the card at hand: an H100 PCIe (114 SMs) or NVL peaks lower
    than the SXM part, whose 989 TFLOP/s would understate their MFU."""
    peak_module = script_module("benchlib.peak", monkeypatch)
    assert peak_module.gpu_peak(device_name) == (peak, f"{key} bf16 dense (table)")


def test_gpu_peak_of_an_unknown_card_is_none(monkeypatch):
    peak_module = script_module("benchlib.peak", monkeypatch)
    assert peak_module.gpu_peak("NVIDIA L4") == (None, "NVIDIA L4: not in the table")


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

    peak_module = script_module("benchlib.peak", monkeypatch)
    probed = []
    monkeypatch.setattr(charlm.runtime.precision, "cpu_bf16_unit", lambda: unit)
    monkeypatch.setattr(peak_module, "cpu_peak", lambda d: probed.append(d) or (1e12, 512))
    assert peak_module.device_peak(torch.device("cpu")) == (1e12, dtype, source)
    assert probed == [dtype]


@pytest.mark.parametrize("unit_s, n", [(0.2 / 512**3, 512), (10.0 / 256**3, 256)])
def test_bench_train_probe_grows_until_a_matmul_takes_a_fifth_of_a_second(monkeypatch, unit_s,
                                                                         n):
    """The probe's size follows the CPU's speed: it grows from 256 until one matmul takes about
    0.2 s (here n^3 * unit_s, a clock standing in for the CPU), and a CPU slower than that at
    256 is probed at 256, not at a size that runs for minutes."""
    peak_module = script_module("benchlib.peak", monkeypatch)
    monkeypatch.setattr(peak_module, "matmul_seconds", lambda a, b: a.shape[0] ** 3 * unit_s)
    peak, size = peak_module.cpu_peak(torch.float32)
    assert size == n and peak == pytest.approx(2 / unit_s)


@pytest.fixture
def float32_cpu(monkeypatch):
    """A CPU that computes float32 natively, whose peak is 1 TFLOP/s without a probe."""
    import charlm.runtime.precision

    monkeypatch.setattr(charlm.runtime.precision, "cpu_bf16_unit", lambda: None)
    monkeypatch.setattr(script_module("benchlib.peak", monkeypatch), "cpu_peak",
                        lambda dtype: (1e12, 64))


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


def test_variants_name_model_changes_or_overrides(monkeypatch):
    from charlm.config.schema import MODEL_VARIANTS

    train = script_module("benchlib.train", monkeypatch)
    args = script_module("bench", monkeypatch).parser().parse_args(
        ["train", TINY, "--variants", "bias=True", "all", "model.n_layer=1"])
    cfgs = train.variant_configs(args)
    assert list(cfgs) == ["bias=True", *(n for n in MODEL_VARIANTS if n != "bias=True"),
                          "model.n_layer=1"]
    assert cfgs["bias=True"].model.bias and cfgs["model.n_layer=1"].model.n_layer == 1
    assert train.variant_overrides("default") == []
    assert train.variant_overrides("tie_weights=False") == ["model.tie_weights=False"]
    assert train.variant_overrides("train.dtype=bfloat16,model.n_embd=64") == [
        "train.dtype=bfloat16", "model.n_embd=64"]


# --- decode ---------------------------------------------------------------------------------

def test_bench_decode_stops_each_decode_after_its_seconds(monkeypatch, capsys):
    """The baby GPT decodes about 10 tokens a second on the busy EPYC, so a 2000-token
    uncached decode took minutes: each decode stops after --seconds, timed over the tokens it
    made (one at least), which its figure says."""
    records, _ = bench(monkeypatch, capsys, "decode", "--configs", TINY, "--variants",
                       "ceiling", "cached", "uncached", "--tokens", "50", "--seconds", "1e-9",
                       "--rounds", "1")
    rounds = {r["variant"]: r for r in kind(records, "round")}
    assert (rounds["cached"]["tokens"], rounds["uncached"]["tokens"]) == (1, 1)
    assert rounds["uncached"]["same_tokens"] and rounds["ceiling"]["tokens"] == 20
    assert kind(records, "summary")[2]["vs_cached"]["n"] == 1


def test_bench_decode_split_all_forces_the_split_and_restores_the_rule(monkeypatch, capsys):
    """`split_all` decodes with every product split (SPLIT_MIN_WEIGHTS = 0), `cached` with the
    rule; they decode the same tokens, and the rule is back after each decode."""
    from charlm.model import layers

    decode = script_module("benchlib.decode", monkeypatch)
    rules = []
    real = decode.generate

    def spy(*args, **kw):
        rules.append(layers.SPLIT_MIN_WEIGHTS)
        return real(*args, **kw)

    monkeypatch.setattr(decode, "generate", spy)
    records, _ = bench(monkeypatch, capsys, "decode", "--configs", TINY, "--variants",
                       "cached", "split_all", "--batches", "2", "--tokens", "5", "--rounds", "2")
    assert rules == [1 << 17, 0] * 3 and layers.SPLIT_MIN_WEIGHTS == 1 << 17  # warm-up, 2 rounds
    rounds = kind(records, "round")
    assert [(r["config"], r["batch"], r["tokens"]) for r in rounds] == [("tiny.yaml", 2, 5)] * 4
    assert all(r["same_tokens"] for r in rounds)


# --- presets --------------------------------------------------------------------------------

def test_bench_presets_needs_a_nanogpt_clone(run_script, tmp_path):
    result = run_script("bench.py", "presets", "--nanogpt", str(tmp_path))
    assert result.code == 2 and result.out == ""
    assert result.err == (f"error: --nanogpt {tmp_path} must name a clone of karpathy/nanoGPT "
                          "(or give --nanogpt-seconds)\n")


def test_bench_presets_refuses_a_bad_set_before_nanogpt_runs(run_script, tmp_path):
    (tmp_path / "train.py").write_text("raise SystemExit('nanoGPT must not run')\n")
    result = run_script("bench.py", "presets", "--nanogpt", str(tmp_path),
                        "--set", "train.dtyp=float32")
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith("error: ") and result.err.count("\n") == 1
    assert "did you mean 'dtype'?" in result.err


def test_bench_presets_times_each_preset_with_its_overrides_beside_nanogpt(monkeypatch, capsys):
    """--set reaches every preset's run, each with its own target, nanoGPT first in every
    round; a preset's time is compared with nanoGPT's of the same round."""
    presets = script_module("benchlib.presets", monkeypatch)
    calls = []

    def fake(config, overrides, target, stop_at_target, max_seconds):
        calls.append((Path(config).name, overrides, target, stop_at_target, max_seconds))
        return {"seconds": 50.0, "final_val": target - 0.05}

    monkeypatch.setattr(presets, "time_to_loss", fake)
    records, err = bench(monkeypatch, capsys, "presets", "--nanogpt-seconds", "200", "--set",
                         "train.dtype=float32", "--set", "train.seed=3", "--rounds", "2")
    sets = ["train.dtype=float32", "train.seed=3"]
    assert calls == [("shakespeare_char_cpu.yaml", sets, 1.88, True, 300.0),
                     ("shakespeare_char_cpu_long.yaml", sets, 1.70, True, 300.0)] * 2
    assert [r["variant"] for r in kind(records, "round")] == [
        "nanoGPT", "shakespeare_char_cpu.yaml", "shakespeare_char_cpu_long.yaml"] * 2
    short = kind(records, "summary")[1]
    assert short["vs_nanoGPT"] == {"min": 0.25, "median": 0.25, "max": 0.25, "n": 2}
    assert "| shakespeare_char_cpu.yaml | 2 | 50.0 (50.0-50.0) | 0.25x (0.25-0.25) |" in err


def test_bench_presets_writes_nanogpts_data_as_its_prepare_does(monkeypatch, tmp_path):
    """nanoGPT's shakespeare_char/prepare.py: ids of the sorted characters as uint16, the first
    90 % of the text in train.bin, the rest in val.bin, and meta.pkl with the vocabulary."""
    import pickle

    import numpy as np

    presets = script_module("benchlib.presets", monkeypatch)
    monkeypatch.setattr(presets, "TEXT", tmp_path / "input.txt")
    (tmp_path / "input.txt").write_text("hello world\n" * 5, encoding="utf-8")
    presets.nanogpt_data(tmp_path)
    meta = pickle.loads((tmp_path / "meta.pkl").read_bytes())
    assert meta["itos"] == dict(enumerate(sorted(set("hello world\n"))))
    assert meta["vocab_size"] == 9 and meta["stoi"]["h"] == 4  # "\n", " ", d, e, h, ...
    ids = np.concatenate([np.fromfile(tmp_path / f, dtype=np.uint16)
                          for f in ("train.bin", "val.bin")])
    assert "".join(meta["itos"][i] for i in ids) == "hello world\n" * 5
    assert len(np.fromfile(tmp_path / "train.bin", dtype=np.uint16)) == int(60 * 0.9)


def test_bench_presets_times_nanogpt_to_its_last_eval(monkeypatch, tmp_path):
    """nanoGPT's time is its last eval line's, from launch; it runs from a copy of the clone,
    on the data written there, which goes with the copy."""
    presets = script_module("benchlib.presets", monkeypatch)
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "train.py").write_text(
        "import os\nassert os.path.getsize('data/shakespeare_char/train.bin') > 0\n"
        "print('step 0: train loss 4.2000, val loss 4.1000')\nprint('iter 1: loss 3.0')\n"
        "print('step 250: train loss 1.9000, val loss 1.8857')\n")
    result = presets.run_nanogpt(tmp_path)
    assert result["final_val"] == 1.8857 and [c["step"] for c in result["curve"]] == [0, 250]
    assert result["seconds"] == result["curve"][-1]["wall_s"] > 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["data", "shakespeare_char",
                                                           "train.py"]


def test_time_to_loss_ends_a_run_at_max_seconds(monkeypatch, tmp_path):
    """A preset's fixed step count held a slow CPU for as long as it took; max_seconds ends
    the run (here a stand-in that would sleep for a minute) and says that it did."""
    loss = script_module("benchlib.loss", monkeypatch)
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


# --- prepare --------------------------------------------------------------------------------

def test_bench_prepare_peak_rss_is_in_mb_like_the_input(monkeypatch):
    """peak_rss_mb is in MB (10^6 bytes) as input_mb and mb_per_s are, not in MiB: Linux's
    ru_maxrss of 1,000,000 KiB is 1024 MB."""
    prepare = script_module("benchlib.prepare", monkeypatch)
    monkeypatch.setattr(prepare.sys, "platform", "linux")
    assert prepare.maxrss_mb(1_000_000) == 1024.0
    monkeypatch.setattr(prepare.sys, "platform", "darwin")  # bytes there
    assert prepare.maxrss_mb(5_000_000) == 5.0


def test_bench_prepare_peak_rss_is_the_childs_own(monkeypatch, tmp_path):
    """A child forked from a process with torch imported reported that process's 240 MB as its
    own peak (Linux keeps the high-water mark across exec); it is started from a small
    interpreter instead, so an empty Python reports what it uses."""
    prepare = script_module("benchlib.prepare", monkeypatch)
    seconds, rss = prepare.run_child([sys.executable, "-c", "pass"], tmp_path)
    assert 0 < seconds < 30 and 1 < rss < 60


# --- no files left behind, stopped or not ---------------------------------------------------

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


# --- the machine ----------------------------------------------------------------------------

@pytest.mark.parametrize("unit", ["AMX", "AVX512_BF16", None])
def test_machine_facts_name_the_cpu_and_what_it_computes_natively(monkeypatch, unit):
    """Every benchmark prints these with its figures: a figure without its machine cannot be
    compared. bf16 is native exactly where charlm's `dtype: auto` trains in it."""
    import charlm.runtime.precision

    common = script_module("common", monkeypatch)
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
    common = script_module("common", monkeypatch)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                       "model name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2\n")
    assert common.cpu_model(cpuinfo) == "AMD EPYC 7B12"
    monkeypatch.setattr(common.platform, "processor", lambda: "arm")
    assert common.cpu_model(tmp_path / "missing") == "arm"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 48.00\n")  # an ARM board's cpuinfo
    assert common.cpu_model(cpuinfo) == "arm"
