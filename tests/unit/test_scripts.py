"""The benchmark harness (scripts/bench.py, scripts/benchlib/) and scripts/common.py, in this
process: bad input as one line, interleaving, statistics, the JSON lines, the probes and the
machine facts, with the work itself faked."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, bench, import_script, kind

TINY = str(ROOT / "configs" / "tiny.yaml")


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
    ("bench.py", [], "charlm's benchmarks, one harness: `decode`, `train`, `presets`, "
     "`prepare` and `serve` time their variants in interleaved rounds (A B A B ...) and report "
     "them alike."),
    ("experiments/g2p_cmudict.py", [], "G2P on CMUdict in a fixed wall time: the "
     "encoder-decoder (configs/g2p_cmudict.yaml) against a decoder-only GPT"),
])
def test_script_help_describes_in_whole_sentences(run_script, name, args, description):
    """--help shows the docstring's first paragraph, not its first line cut mid-sentence."""
    result = run_script(name, *args, "--help")
    assert result.code == 0, result.err
    assert description in " ".join(result.out.split())


def test_interleave_runs_every_variant_once_a_round_in_turn_after_its_warmup(monkeypatch):
    harness = import_script("benchlib.harness", monkeypatch)
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
    harness = import_script("benchlib.harness", monkeypatch)
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
    harness = import_script("benchlib.harness", monkeypatch)
    common = import_script("common", monkeypatch)
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
    assert lines[0] == common.machine_line(machine)  # the record's facts: bf16 speed is timed
    assert lines[1] == "round 1, x base: 10.0 rate"
    assert lines[-1] == "| x | new | 2 | 17.5 (15.0-20.0) | 1.25x (1-1.5) |"


def test_trees_run_one_child_each_in_turn_every_round(monkeypatch, tmp_path):
    """--tree A --tree B: round 1 runs A then B, round 2 A then B, each child one round of the
    same subcommand without --tree; the variants are named after their tree, and a child's
    results are taken once."""
    trees = import_script("benchlib.trees", monkeypatch)
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
    trees = import_script("benchlib.trees", monkeypatch)
    with trees.checkouts(["HEAD"]) as paths:
        tree = paths["HEAD"]
        assert (tree / "charlm" / "__init__.py").is_file() and tree != ROOT
    assert not tree.exists()


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
    peak_module = import_script("benchlib.peak", monkeypatch)
    assert peak_module.gpu_peak(device_name) == (peak, f"{key} bf16 dense (table)")


def test_gpu_peak_of_an_unknown_card_is_none(monkeypatch):
    peak_module = import_script("benchlib.peak", monkeypatch)
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
    import charlm.runtime.profile

    peak_module = import_script("benchlib.peak", monkeypatch)
    probed = []
    monkeypatch.setattr(charlm.runtime.profile.Machine, "bf16_unit", lambda self: unit)
    monkeypatch.setattr(charlm.runtime.profile.Machine, "bf16_speedup", lambda self: 4.1)
    monkeypatch.setattr(peak_module, "cpu_peak", lambda d: probed.append(d) or (1e12, 512))
    assert peak_module.device_peak(torch.device("cpu")) == (1e12, dtype, source)
    assert probed == [dtype]


@pytest.mark.parametrize("unit_s, n", [(0.2 / 512**3, 512), (10.0 / 256**3, 256)])
def test_bench_train_probe_grows_until_a_matmul_takes_a_fifth_of_a_second(monkeypatch, unit_s,
                                                                         n):
    """The probe's size follows the CPU's speed: it grows from 256 until one matmul takes about
    0.2 s (here n^3 * unit_s, a clock standing in for the CPU), and a CPU slower than that at
    256 is probed at 256, not at a size that runs for minutes."""
    peak_module = import_script("benchlib.peak", monkeypatch)
    monkeypatch.setattr(peak_module, "matmul_seconds", lambda a, b: a.shape[0] ** 3 * unit_s)
    peak, size = peak_module.cpu_peak(torch.float32)
    assert size == n and peak == pytest.approx(2 / unit_s)


def test_variants_name_model_changes_or_overrides(monkeypatch):
    from charlm.config.schema import MODEL_VARIANTS

    train = import_script("benchlib.train", monkeypatch)
    bench = import_script("bench", monkeypatch)
    argv = ["train", TINY, "--variants", "bias=True", "all", "model.n_layer=1"]
    args = bench.parser(bench.benches(argv)).parse_args(argv)
    cfgs = train.variant_configs(args)
    assert list(cfgs) == ["bias=True", *(n for n in MODEL_VARIANTS if n != "bias=True"),
                          "model.n_layer=1"]
    assert cfgs["bias=True"].model.bias and cfgs["model.n_layer=1"].model.n_layer == 1
    assert train.variant_overrides("default") == []
    assert train.variant_overrides("tie_weights=False") == ["model.tie_weights=False"]
    assert train.variant_overrides("train.dtype=bfloat16,model.n_embd=64") == [
        "train.dtype=bfloat16", "model.n_embd=64"]


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
    presets = import_script("benchlib.presets", monkeypatch)
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

    presets = import_script("benchlib.presets", monkeypatch)
    (tmp_path / "input.txt").write_text("hello world\n" * 5, encoding="utf-8")
    presets.nanogpt_data(tmp_path, tmp_path / "input.txt")
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
    presets = import_script("benchlib.presets", monkeypatch)
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


def test_bench_nanogpt_score_without_a_kept_checkpoint_says_so(monkeypatch, tmp_path):
    """A nanoGPT run that saved no ckpt.pt (no eval after step 0) ends with one error line
    instead of a traceback from the scoring script."""
    presets = import_script("benchlib.presets", monkeypatch)
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "train.py").write_text("print('step 0: train loss 4.2000, val loss 4.1000')\n")
    with pytest.raises(SystemExit) as e:
        presets.run_nanogpt(tmp_path, score=True)
    assert str(e.value) == ("error: nanoGPT kept no ckpt.pt to score: its run ended before its "
                            "first eval after step 0 (every 250 steps); give it a longer budget")


def test_bench_names_the_model_a_run_recorded(monkeypatch, tmp_path):
    """A run's model from its config.yaml (where a sized pick is recorded), dropout when any;
    None where the run wrote no config."""
    loss = import_script("benchlib.loss", monkeypatch)
    config = tmp_path / "config.yaml"
    assert loss.shape(config) is None
    config.write_text("model:\n  n_layer: 4\n  n_embd: 192\n  block_size: 128\n  dropout: 0.0\n")
    assert loss.shape(config) == "4 x 192, block 128"
    config.write_text("model: {n_layer: 2, n_embd: 96, block_size: 64, dropout: 0.1}\n")
    assert loss.shape(config) == "2 x 96, block 64, dropout 0.1"


def test_bench_prepare_peak_rss_is_in_mb_like_the_input(monkeypatch):
    """peak_rss_mb is in MB (10^6 bytes) as input_mb and mb_per_s are, not in MiB: Linux's
    ru_maxrss of 1,000,000 KiB is 1024 MB."""
    prepare = import_script("benchlib.prepare", monkeypatch)
    monkeypatch.setattr(prepare.sys, "platform", "linux")
    assert prepare.maxrss_mb(1_000_000) == 1024.0
    monkeypatch.setattr(prepare.sys, "platform", "darwin")  # bytes there
    assert prepare.maxrss_mb(5_000_000) == 5.0


@pytest.mark.parametrize("unit, speedup, ending", [
    ("AMX", 6.0, "bf16 native (AMX, 6.0x float32's speed)"),
    ("AVX512_BF16", 4.1, "bf16 native (AVX512_BF16, 4.1x float32's speed)"),
    ("AVX512_BF16", 0.49, "bf16 native (AVX512_BF16, 0.49x float32's speed: auto trains in "
     "float32)"),
    (None, 0.01, "float32 native (bf16 emulated)"),
])
def test_machine_facts_name_the_cpu_and_what_it_computes_natively(monkeypatch, unit, speedup,
                                                                  ending):
    """Every benchmark prints these with its figures: a figure without its machine cannot be
    compared. charlm's `dtype: auto` trains in bf16 where a unit computes it and measures
    faster than float32."""
    import charlm.runtime.profile

    common = import_script("common", monkeypatch)
    monkeypatch.setattr(charlm.runtime.profile.Machine, "bf16_unit", lambda self: unit)
    monkeypatch.setattr(charlm.runtime.profile.Machine, "bf16_speedup", lambda self: speedup)
    monkeypatch.setattr(common, "cpu_model", lambda: "Test CPU 9000")
    facts = common.machine_facts()
    assert list(facts) == ["cpu", "logical_cores", "torch_threads", "torch", "cpu_capability",
                           "bf16_unit", "bf16_speedup", "gpu"]
    assert facts["cpu"] == "Test CPU 9000" and facts["bf16_unit"] == unit
    assert facts["bf16_speedup"] == (speedup if unit else None)
    assert facts["torch"] == torch.__version__ and facts["logical_cores"] == os.cpu_count()
    assert common.cpu_native_dtype() == (
        torch.bfloat16 if unit and speedup >= 1.5 else torch.float32)
    line = common.machine_line(facts)
    assert line.startswith(f"machine: Test CPU 9000, {os.cpu_count()} logical cores, "
                           f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, "
                           f"{torch.backends.cpu.get_cpu_capability()}, ")
    assert line.endswith(ending)


def test_cpu_model_reads_cpuinfo_else_asks_platform(monkeypatch, tmp_path):
    common = import_script("common", monkeypatch)
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                       "model name\t: AMD EPYC 7B12\nflags\t\t: fpu avx2\n")
    assert common.cpu_model(cpuinfo) == "AMD EPYC 7B12"
    monkeypatch.setattr(common.platform, "processor", lambda: "arm")
    assert common.cpu_model(tmp_path / "missing") == "arm"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 48.00\n")  # an ARM board's cpuinfo
    assert common.cpu_model(cpuinfo) == "arm"


def test_bench_optimizers_trains_each_config_with_both_for_the_same_time(monkeypatch, capsys):
    """Every round trains each config with adamw, then muon, both under the same time budget
    and seed (the config's seed + round - 1); the best val of a run is its curve's lowest, and
    muon's is compared with adamw's of the same round."""
    optimizers = import_script("benchlib.optimizers", monkeypatch)
    calls = []

    def fake(config, overrides, target, stop_at_target, max_seconds):
        calls.append((config and Path(config).name, overrides, target, stop_at_target,
                      max_seconds))
        best = 1.8 if "optim.name=muon" in overrides else 2.0
        return {"final_val": best + 0.1, "total_wall_s": 31.0, "stopped_at_max_seconds": False,
                "curve": [{"step": 50, "val_loss": best + 0.2}, {"step": 90, "val_loss": best},
                          {"step": 100, "val_loss": best + 0.1}]}

    monkeypatch.setattr(optimizers, "time_to_loss", fake)
    records, err = bench(monkeypatch, capsys, "optimizers", TINY, "defaults", "--time", "30s",
                         "--set", "train.dtype=float32", "--rounds", "2")
    runs = [(config, [f"optim.name={name}", "train.max_time=30.0", f"train.seed={seed}"])
            for seed in (1337, 1338) for config in ("tiny.yaml", None)
            for name in ("adamw", "muon")]
    assert calls == [(config, ["train.dtype=float32", *sets], 0.0, False, 210.0)
                     for config, sets in runs]
    assert [(r["config"], r["variant"], r["best_val"], r["steps"])
            for r in kind(records, "round")][:2] == [("tiny.yaml", "adamw", 2.0, 100),
                                                     ("tiny.yaml", "muon", 1.8, 100)]
    muon = kind(records, "summary")[1]
    assert (muon["config"], muon["variant"]) == ("tiny.yaml", "muon")
    assert muon["vs_adamw"] == {"min": 0.9, "median": 0.9, "max": 0.9, "n": 2}
    assert "| defaults | muon | 2 | 1.8 (1.8-1.8) | 0.9x (0.9-0.9) |" in err


@pytest.mark.parametrize("args, message", [
    (["--time", "soon"], "error: invalid config value --time"),
    (["--set", "optim.muon_lr=0"], "error: invalid config value optim.muon_lr: 0.0 must be > 0"),
])
def test_bench_optimizers_refuses_bad_input_in_one_line(run_script, args, message):
    result = run_script("bench.py", "optimizers", TINY, *args)
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith(message) and result.err.count("\n") == 1


def test_bench_busy_times_each_variant_beside_each_neighbour(monkeypatch, capsys):
    """Every round runs each config alone first, then beside each neighbour, with
    train.threads auto and pinned to the usable cores; vs_alone is a run's wall time over the
    same variant's alone in that round."""
    busy = import_script("benchlib.busy", monkeypatch)
    calls = []
    walls = {("alone", "auto"): 10.0, ("alone", "2"): 10.0, ("loop2", "auto"): 25.0,
             ("loop2", "2"): 90.0}

    def fake(config, steps, threads, beside):
        calls.append((config and Path(config).name, steps, threads, beside))
        return {"wall_s": walls[beside, threads], "threads": 1 if beside != "alone" else 2}

    monkeypatch.setattr(busy, "timed_run", fake)
    monkeypatch.setattr(busy.Machine, "cores", lambda self: 2)
    records, err = bench(monkeypatch, capsys, "busy", TINY, "--steps", "40",
                         "--beside", "loop2", "alone")
    assert calls == [("tiny.yaml", 40, threads, beside) for beside in ("alone", "loop2")
                     for threads in ("auto", "2")]
    rows = [(r["beside"], r["variant"], r["vs_alone"], r["tokens_per_s"])
            for r in kind(records, "round")]
    assert rows == [("alone", "auto", 1.0, 40 * 16 * 16 // 10), ("alone", "all", 1.0, 1024),
                    ("loop2", "auto", 2.5, 410), ("loop2", "all", 9.0, 114)]


def test_bench_frontier_gives_each_budget_to_each_variant(monkeypatch, capsys, tmp_path):
    """Every budget trains the sized model and each preset with --time, and nanoGPT's recipe
    with the steps its measured step time fits in the budget; `within` is the deadline of issue
    43 (5 % or 10 s), `target` the sized model's; `--set` keys go to every charlm run, last."""
    frontier = import_script("benchlib.frontier", monkeypatch)
    charlm_calls, nanogpt_calls = [], []

    def fake_charlm(config, overrides, target, stop_at_target, max_seconds, score):
        charlm_calls.append((config and Path(config).name, overrides, target, stop_at_target,
                             score))
        seconds = float(overrides[1].removeprefix("train.max_time="))
        return {"final_val": 1.6, "full_val": 1.55, "model": "2 x 96, block 64",
                "total_wall_s": seconds + (12.0 if config else 1.0),
                "curve": [{"step": 10, "val_loss": 1.7}, {"step": 20, "val_loss": 1.5},
                          {"step": 30, "val_loss": 1.6}]}

    def fake_nanogpt(clone, iters=None, score=False, text=None):
        nanogpt_calls.append((iters, score, text))
        return {"step_s": 0.05, "best_val": 1.9, "final_val": 1.95, "total_wall_s": 290.0,
                "full_val": 1.97 if score else None}

    monkeypatch.setattr(frontier, "time_to_loss", fake_charlm)
    monkeypatch.setattr(frontier, "run_nanogpt", fake_nanogpt)
    (tmp_path / "train.py").write_text("")
    records, _ = bench(monkeypatch, capsys, "frontier", "--times", "1m", "5m", "--variants",
                       "sized", "shakespeare_char_cpu", "nanoGPT", "--nanogpt", str(tmp_path),
                       "--set", "train.seed=2", "--set", "model.n_layer=4")
    text = frontier.TEXT
    assert charlm_calls == [(config, [f"data.path={text}", f"train.max_time={s}",
                                      "train.seed=2", "model.n_layer=4"], 0.0, False, True)
                            for s in (60.0, 300.0)
                            for config in (None, "shakespeare_char_cpu.yaml")]
    # measured once, then (T - 5 s) / (0.05 s x 1.07) steps down to a multiple of 250 (1,028
    # and 5,514 fit), scored on the whole val split
    assert nanogpt_calls == [(300, False, text), (1000, True, text), (5500, True, text)]
    rounds = [(r["time"], r["variant"], r["full_val"], r["best_val"], r["steps"], r["within"],
               r["target"]) for r in kind(records, "round")]
    assert [r["model"] for r in kind(records, "round")] == [
        "2 x 96, block 64", "2 x 96, block 64", "4 x 128, block 64"] * 2
    assert rounds == [
        ("60s", "sized", 1.55, 1.5, 30, True, None),
        ("60s", "shakespeare_char_cpu", 1.55, 1.5, 30, False, None),  # 72 s: past 60 + 10 s
        ("60s", "nanoGPT", 1.97, 1.9, 1000, False, None),
        ("300s", "sized", 1.55, 1.5, 30, True, 1.5),
        ("300s", "shakespeare_char_cpu", 1.55, 1.5, 30, True, None),  # 312 s: within 5 %
        ("300s", "nanoGPT", 1.97, 1.9, 5500, True, None)]


def test_bench_frontier_trains_everyone_on_the_text_given(monkeypatch, capsys, tmp_path):
    """`--text FILE`: charlm's runs and nanoGPT's train on FILE; tiny-shakespeare's targets are
    not given for it."""
    frontier = import_script("benchlib.frontier", monkeypatch)
    paths = []

    def fake_charlm(config, overrides, *_, **__):
        paths.append(overrides[0])
        return {"final_val": 1.6, "full_val": 1.55, "model": "2 x 96, block 64",
                "total_wall_s": 300.0, "curve": [{"step": 10, "val_loss": 1.7}]}

    def fake_nanogpt(clone, iters=None, score=False, text=None):
        paths.append(text)
        return {"step_s": 0.05, "best_val": 1.9, "final_val": 1.95, "total_wall_s": 290.0,
                "full_val": 1.97}

    monkeypatch.setattr(frontier, "time_to_loss", fake_charlm)
    monkeypatch.setattr(frontier, "run_nanogpt", fake_nanogpt)
    (tmp_path / "train.py").write_text("")
    code = tmp_path / "code.txt"
    records, _ = bench(monkeypatch, capsys, "frontier", "--times", "5m", "--variants", "sized",
                       "nanoGPT", "--nanogpt", str(tmp_path), "--text", str(code))
    assert paths == [f"data.path={code}", code, code]  # nanoGPT: its step time, then its run
    assert [r["target"] for r in kind(records, "round")] == [None, None]


def test_bench_serve_engine_variant_gives_each_client_its_greedy_texts_in_turn(monkeypatch):
    """`--variants engine`: `drive` submits each client's next request when its last one ends
    and decodes on this thread until the last; each text is `charlm sample`'s greedy text."""
    from charlm.config.loading import load_config
    from charlm.config.sampling import SampleConfig
    from charlm.generation.text import sample_text
    from charlm.model.gpt import GPT
    from charlm.serve.engine import Engine

    serve = import_script("benchlib.serve", monkeypatch)
    torch.manual_seed(0)
    model = GPT(load_config(TINY).model, len(serve.VOCAB)).eval()
    engine = Engine(model, serve.VOCAB, slots=2)  # 3 clients: one waits for a slot
    seconds, results = serve.drive(engine, 3, 2, 5)
    assert seconds > 0 and engine.stopped.is_set() and engine.stats().characters == 30
    prompts = [serve.PROMPTS[(c + r) % len(serve.PROMPTS)] for c in range(3) for r in range(2)]
    greedy = SampleConfig(max_new_tokens=5, temperature=0)
    assert [r["text"] for r in results] == [
        sample_text(model, serve.VOCAB, p, greedy)[0].text for p in prompts]
    assert all(r["ttfc"] > 0 and len(r["gaps"]) == 4 for r in results)
