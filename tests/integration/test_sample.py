import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from charlm.config.loading import load_config
from tests.helpers import COMMANDS, ROOT, SHAKESPEARE, VARIANTS


def test_python_m_charlm_help():
    out = subprocess.run([sys.executable, "-m", "charlm", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for command in COMMANDS:
        assert command in out


def test_a_bad_train_config_is_reported_before_torch_is_imported(tmp_path):
    """A mistyped --set key or config path took 2 s to report: the time to import torch."""
    code = ("import sys; from charlm.cli.app import main\n"
            "try:\n    main(sys.argv[1:])\n"
            "finally:\n    print('torch' in sys.modules)")
    for args, error in [(["missing.yaml"], "error: config file not found: missing.yaml"),
                        (["--set", "model.n_layr=3"], "did you mean 'n_layer'?"),
                        (["--resume", "--overwrite"], "--resume and --overwrite exclude")]:
        result = subprocess.run([sys.executable, "-c", code, "train", *args], cwd=tmp_path,
                                capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stdout) == (2, "False\n")
        assert result.stderr.startswith("error: ") and error in result.stderr


def test_sample_and_info_do_not_import_the_compiler(tiny_run):
    """Counting parameters on the meta device drew normal values there, which imports
    torch._dynamo: 1.8 s of the 5 s `charlm sample` took to start on the EPYC."""
    code = ("import sys; from charlm.cli.app import main\n"
            "run, config = sys.argv[1:]\n"
            "for args in (['sample', run, '--max-new-tokens', '5'], ['info', run],\n"
            "             ['info', config]):\n"
            "    try:\n        main(args)\n"
            "    except SystemExit as e:\n        assert not e.code, (args, e.code)\n"
            "print('torch._dynamo' in sys.modules, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code, tiny_run, ROOT / "configs" / "tiny.yaml"],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.splitlines()[-1]) == (0, "False"), result.stderr


def test_training_and_resuming_without_compile_do_not_import_the_compiler(tmp_path):
    """torch.optim's methods import torch._dynamo at their first call (2.1 s of every
    `charlm train`'s start on the EPYC); charlm's AdamW does not, so a run that compiles
    nothing never imports it, through evals, checkpoints and a resume."""
    code = ("import sys; from charlm.cli.app import main\n"
            "config, out = sys.argv[1:]\n"
            "for args in (['train', config, '--out', out, '--set', 'train.max_iters=4'],\n"
            "             ['train', '--resume', '--out', out, '--set', 'train.max_iters=6']):\n"
            "    try:\n        main(args)\n"
            "    except SystemExit as e:\n        assert not e.code, (args, e.code)\n"
            "print('torch._dynamo' in sys.modules, file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code, ROOT / "configs" / "tiny.yaml",
                             tmp_path / "run"], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr.splitlines()[-1]) == (0, "False"), result.stderr
    assert '"step": 6' in (tmp_path / "run" / "metrics.jsonl").read_text()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(cli, command):
    result = cli(command, "--help")
    assert result.code == 0
    assert f"Usage: charlm {command}" in result.out


def test_help_names_arguments_as_the_readme_does(cli):
    assert "{RUN_DIR_OR_CKPT} {TEXT_FILE}" in cli("eval", "--help").out
    assert "the built-in defaults, a small GPT-2" in " ".join(cli("train", "--help").out.split())


def test_sample_help_shows_every_sample_option_with_its_help(cli):
    """`charlm sample`'s options are built from SampleConfig's fields: each shows, with its
    help, its name and its default."""
    from dataclasses import fields

    from charlm.config.sampling import SampleConfig

    out = " ".join(cli("sample", "--help").out.split())
    for f in fields(SampleConfig):
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        assert f"{flag} " in out and " ".join(f.metadata["help"].split()) in out, f.name
    assert "--max-new-tokens <int> Characters to generate per sample. [default: 500]" in out
    assert "--include-stop / --no-include-stop" in out and "--no-cache " in out


@pytest.mark.parametrize("command", ["train", "sample", "eval"])
def test_device_help_lists_the_devices_the_readme_does(cli, command):
    """train's --device help said 'auto, cpu, cuda or mps', without cuda:N, which it takes."""
    assert "--device DEVICE auto, cpu, cuda (the first GPU), cuda:N or mps" in " ".join(
        cli(command, "--help").out.split())


def test_prepare_command(cli, tmp_path):
    out = tmp_path / "ds"
    result = cli("prepare", SHAKESPEARE, "--out", out)
    assert result.code == 0
    assert result.out.strip() == (
        f"wrote {out}: 65 symbols (uint8), 1,003,854 train / 111,540 val characters")
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_train_command_and_refusal_to_clobber(cli, tmp_path, corpus):
    run = tmp_path / "run"
    args = ["train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run,
            "--set", "train.max_iters=20"]
    result = cli(*args)
    assert result.code == 0, result.err
    assert "step 20: train" in result.out and f"checkpoints in {run}" in result.out
    assert load_config(run / "config.yaml").train.max_iters == 20
    before = (run / "last.pt").read_bytes()
    again = cli(*args)
    assert again.code == 2
    assert again.err.startswith(
        f"error: {run} already holds a run (last.pt, best.pt, metrics.jsonl, tb, config.yaml)")
    assert (run / "last.pt").read_bytes() == before
    # min_lr 5e-3 is legal under the run's lr (tiny.yaml: 1e-2), not under the default 4e-3.
    resumed = cli("train", "--out", run, "--resume", "--set", "train.max_iters=30",
                  "--set", "optim.min_lr=5e-3")
    assert resumed.code == 0, resumed.err
    assert "done: 30 steps" in resumed.out
    assert load_config(run / "config.yaml").optim.min_lr == 5e-3


def test_sample_cached_equals_uncached_greedy(cli, tiny_run):
    args = ["sample", tiny_run, "--prompt", "ROMEO:", "--temperature", "0",
            "--max-new-tokens", "11"]  # block 16: the whole first window
    cached, uncached = cli(*args), cli(*args, "--no-cache")
    assert cached.code == 0 and cached.err == ""
    assert cached.out == uncached.out
    assert cached.out.startswith("ROMEO:") and len(cached.out) == len("ROMEO:") + 11 + 1


def test_sample_seed_reproducible_and_num_samples(cli, tiny_run):
    args = ["sample", tiny_run, "--max-new-tokens", "60", "--num-samples", "3"]
    a, b = cli(*args, "--seed", "7"), cli(*args, "--seed", "7")
    c = cli(*args, "--seed", "8")
    assert a.out == b.out != c.out
    samples = a.out.split("\n" + "-" * 40 + "\n")
    assert len(samples) == 3
    assert all(len(s.rstrip("\n")) >= 1 for s in samples)
    assert len(cli("sample", tiny_run, "--max-new-tokens", "100").out) == 1 + 100 + 1


def test_sample_rejects_unknown_prompt_characters(cli, tiny_run):
    result = cli("sample", tiny_run, "--prompt", "Hi ☃ there€")
    assert result.code == 2
    assert result.err == ("error: prompt has characters outside the model's vocabulary: "
                          "'☃' at position 3, '€' at position 10; remove them or pass "
                          "--unknown skip\n")
    assert result.out == ""


@pytest.mark.parametrize("args, message", [
    (["--temperature", "-1"], "error: --temperature must be >= 0 (0 is greedy), got -1.0\n"),
    (["--top-k", "0"], "error: --top-k must be >= 1, got 0\n"),
    (["--compile", "--no-cache"],
     "error: --compile compiles the KV-cached decode step; it cannot go with --no-cache\n"),
])
def test_sample_rejects_bad_options(cli, tiny_run, args, message):
    result = cli("sample", tiny_run, *args)
    assert (result.code, result.err) == (2, message)


def test_sample_missing_checkpoint(cli, tmp_path):
    result = cli("sample", tmp_path / "nope")
    assert (result.code, result.err) == (
        2, f"error: no such run dir or checkpoint: {tmp_path / 'nope'}\n")


def test_info_on_run_dir_and_config(cli, tiny_run):
    result = cli("info", tiny_run)
    assert result.code == 0
    assert "vocab size: " in result.out and "step: 60" in result.out
    assert "total" in result.out and "n_layer: 2" in result.out
    assert "forward pass" not in result.out  # only with --shapes
    from_config = cli("info", ROOT / "configs" / "shakespeare_char.yaml")
    assert from_config.code == 0
    lines = from_config.out.splitlines()
    total = next(line for line in lines if line.strip().startswith("total"))
    assert total.split()[-1] == "10,745,088"
    assert "position embedding (learned)" in from_config.out
    training = next(line for line in lines if line.strip().startswith("training"))
    assert training.split()[-1] == f"{6 * 10_646_784 + 12 * 6 * 384 * 256:,}"


def test_info_json_with_shapes(cli, tiny_run):
    result = cli("info", tiny_run, "--json", "--shapes", "--batch", "3", "--seq-len", "5")
    assert result.code == 0, result.err
    info = json.loads(result.out)
    vocab = info["vocab_size"]
    assert info["checkpoint"]["step"] == 60
    assert info["parameters"]["total"] == sum(
        r["params"] for r in info["parameters"]["rows"] if r["section"] != "layer"
    ) + 2 * info["parameters"]["per_layer"]
    assert info["flops_per_token"]["context"] == 16
    assert info["shapes"][0]["shape"] == [3, 5]
    assert info["shapes"][-1] == {"stage": "head", "what": "logits", "shape": [3, 5, vocab]}
    assert info["config"]["model"]["n_layer"] == 2
    text = cli("info", tiny_run, "--shapes")  # defaults: train.batch_size x block_size
    assert "  head                              16 x 16 x " in text.out


def test_info_set_overrides_the_architecture_of_a_config(cli):
    result = cli("info", ROOT / "configs" / "tiny.yaml", "--vocab-size", "65", "--json",
                 "--set", "model.activation=swiglu", "--set", "model.pos_encoding=rope")
    rows = {r["component"]: r["params"] for r in json.loads(result.out)["parameters"]["rows"]}
    assert rows["mlp gate weight"] == 88 * 32
    assert rows["position encoding (rotary, applied to q and k)"] == 0
    bad = cli("info", ROOT / "configs" / "tiny.yaml", "--vocab-size", "65", "--shapes",
              "--seq-len", "17")
    assert (bad.code, bad.err) == (2, "error: --seq-len 17 must be in 1..block_size (16)\n")
    typo = cli("info", ROOT / "configs" / "tiny.yaml", "--set", "model.pos_encoding=alibi")
    assert typo.code == 2 and "expected one of 'learned', 'sinusoidal', 'rope', 'none'" in typo.err


def test_every_option_changed_trains_resumes_and_samples(cli, tmp_path, corpus):
    run = tmp_path / "run"
    arch = [f"model.{k}={v}" for k, v in VARIANTS["all_changed"].items()]
    sets = [a for kv in arch for a in ("--set", kv)]
    first = cli("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run, *sets,
                "--set", "train.max_iters=10", "--set", "train.eval_interval=5")
    assert first.code == 0, first.err
    resumed = cli("train", "--out", run, "--resume", "--set", "train.max_iters=15")
    assert resumed.code == 0 and "done: 15 steps" in resumed.out
    conflict = cli("train", "--out", run, "--resume", "--set", "model.norm=layernorm")
    assert conflict.code == 2 and "model.norm='layernorm' conflicts" in conflict.err
    args = ["sample", run, "--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "11"]
    cached, uncached = cli(*args), cli(*args, "--no-cache")
    assert cached.code == 0 and cached.out == uncached.out
    info = json.loads(cli("info", run, "--json").out)
    assert info["config"]["model"]["pos_encoding"] == "rope"
    assert info["checkpoint"]["step"] == 15
    assert not info["parameters"]["tied"]


def test_bad_config_gives_one_error_line(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  n_embd: 30\n  n_head: 4\n")
    result = cli("train", bad)
    assert result.code == 2
    assert result.err == ("error: invalid config value model.n_embd: 30 is not divisible by "
                          "model.n_head=4; choose n_embd as a multiple of n_head\n")
    assert "Traceback" not in result.err


def test_train_on_missing_data_file(cli, tmp_path):
    result = cli("train", ROOT / "configs" / "tiny.yaml", "--data", tmp_path / "none.txt",
                 "--out", tmp_path / "run")
    assert (result.code, result.err) == (
        2, f"error: input file not found: {tmp_path / 'none.txt'}\n")


def test_sample_prompt_from_file_and_stdin(cli, tiny_run, tmp_path, monkeypatch):
    greedy = ["sample", tiny_run, "--temperature", "0", "--max-new-tokens", "20"]
    direct = cli(*greedy, "--prompt", "First Citizen:")
    path = tmp_path / "prompt.txt"
    path.write_text("First Citizen:", encoding="utf-8")
    assert cli(*greedy, "--prompt-file", path).out == direct.out

    def stdin(data: bytes):  # in whatever encoding the locale names: the bytes are read
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="latin-1"))

    stdin(b"First Citizen:")
    assert cli(*greedy, "--prompt", "-").out == direct.out
    path.write_text("\ufeffFirst Citizen:", encoding="utf-8")  # a byte order mark is dropped
    assert cli(*greedy, "--prompt-file", path).out == direct.out
    stdin("\ufeffFirst Citizen:".encode())
    assert cli(*greedy, "--prompt", "-").out == direct.out
    stdin(b"First \xffCitizen:")
    invalid = cli(*greedy, "--prompt", "-")
    assert (invalid.code, invalid.err, invalid.out) == (
        2, "error: the prompt on stdin is not valid UTF-8 text (invalid byte 0xff at byte offset "
           "6); charlm reads text files as UTF-8, convert it first\n", "")
    monkeypatch.setattr("sys.stdin", None)  # `<&-`: an AttributeError traceback before
    closed = cli(*greedy, "--prompt", "-")
    assert (closed.code, closed.err) == (
        2, "error: --prompt - reads the prompt from stdin, which is closed; pipe the prompt in, "
           "or give --prompt TEXT or --prompt-file\n")
    stdin(b"First\r\nCitizen:")  # CRLF kept, as in a prompt file (text mode made it LF)
    crlf = cli(*greedy, "--prompt", "-")
    assert (crlf.code, crlf.err) == (
        2, "error: prompt has characters outside the model's vocabulary: '\\r' at position 5; "
           "remove them or pass --unknown skip\n")
    both = cli(*greedy, "--prompt", "x", "--prompt-file", path)
    assert (both.code, both.err) == (
        2, "error: give the prompt either with --prompt or with --prompt-file, not both\n")


def test_sample_unknown_skip_warns_and_continues(cli, tiny_run):
    args = ["sample", tiny_run, "--temperature", "0", "--max-new-tokens", "10"]
    skipped = cli(*args, "--prompt", "Hi ☃there", "--unknown", "skip")
    assert skipped.code == 0
    assert skipped.err == ("warning: skipped 1 character of the prompt outside the vocabulary: "
                           "'☃' at position 3\n")
    assert skipped.out == cli(*args, "--prompt", "Hi there").out


def test_sample_long_prompt_warns(cli, tiny_run):
    result = cli("sample", tiny_run, "--prompt", "a" * 40, "--max-new-tokens", "3")
    assert result.code == 0
    assert result.err == ("warning: the prompt has 40 characters, more than the context of 16;"
                          " using its last 16\n")
    assert result.out.startswith("a" * 16 + result.out[16:]) and len(result.out) == 16 + 3 + 1


def test_sample_json_and_no_stream(cli, tiny_run):
    args = ["sample", tiny_run, "--max-new-tokens", "30", "--num-samples", "2", "--seed", "3"]
    lines = cli(*args, "--json").out.splitlines()
    objects = [json.loads(line) for line in lines]
    assert len(objects) == 2
    for o in objects:
        assert set(o) == {"text", "prompt", "tokens", "seconds", "stopped"}
        assert o["prompt"] == "\n" and o["tokens"] == 30 and len(o["text"]) == 30
        assert o["stopped"] is False
    plain = cli(*args, "--no-stream").out
    assert plain == "\n" + objects[0]["text"] + "\n" + "-" * 40 + "\n\n" + objects[1]["text"] + "\n"
    assert cli(*args).out == plain  # streaming prints the same text


def test_sample_stop_string(cli, tiny_run):
    args = ["sample", tiny_run, "--temperature", "0", "--max-new-tokens", "200", "--prompt", "A"]
    free = cli(*args).out
    stop = free[6:8]
    cut = free.index(stop, 1)
    assert cli(*args, "--stop", stop).out == free[:cut] + "\n"
    assert cli(*args, "--stop", stop, "--include-stop").out == free[:cut + 2] + "\n"
    stopped = json.loads(cli(*args, "--stop", stop, "--json").out)  # as the API's Sample.stopped
    assert (stopped["text"], stopped["stopped"]) == (free[1:cut], True)


def test_sample_beams(cli, tiny_run):
    args = ["sample", tiny_run, "--max-new-tokens", "12", "--prompt", "The"]
    assert cli(*args, "--beams", "1").out == cli(*args, "--temperature", "0").out
    beam = cli(*args, "--beams", "3")
    assert beam.code == 0 and beam.out.startswith("The") and len(beam.out) == 3 + 12 + 1
    both = cli(*args, "--beams", "3", "--num-samples", "2")
    assert (both.code, both.err) == (
        2, "error: --beams returns the single best sequence; use --num-samples 1 with --beams\n")


@pytest.mark.parametrize("args, message", [
    (["--top-p", "0"], "error: --top-p must be in (0, 1], got 0.0\n"),
    (["--top-p", "1.5"], "error: --top-p must be in (0, 1], got 1.5\n"),
    (["--min-p", "-0.1"], "error: --min-p must be in [0, 1], got -0.1\n"),
    (["--repetition-penalty", "0"],
     "error: --repetition-penalty must be > 0 (1 is off), got 0.0\n"),
    (["--beams", "0"], "error: --beams must be >= 1, got 0\n"),
    (["--unknown", "drop"], "error: --unknown must be 'error' or 'skip', got 'drop'\n"),
    (["--max-new-tokens", "-5"], "error: --max-new-tokens must be >= 0, got -5\n"),
    (["--seed", str(2**64)], f"error: --seed must be in [-2**63, 2**64 - 1], got {2**64}\n"),
    (["--seed", str(-2**63 - 1)],
     f"error: --seed must be in [-2**63, 2**64 - 1], got {-2**63 - 1}\n"),
])
def test_sample_rejects_more_bad_options(cli, tiny_run, args, message):
    result = cli("sample", tiny_run, *args)
    assert (result.code, result.err, result.out) == (2, message, "")


def test_corrupt_and_foreign_checkpoints_give_one_error_line(cli, tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00not a checkpoint" * 20)
    foreign = tmp_path / "ckpt.pt"  # what nanoGPT writes
    torch.save({"model": {}, "model_args": {"n_layer": 1}, "iter_num": 3}, foreign)
    for command in (["sample"], ["info"]):
        bad = cli(*command, garbage)
        assert bad.code == 2 and bad.err.startswith(f"error: cannot load checkpoint {garbage}")
        assert bad.err.count("\n") == 1 and "Traceback" not in bad.err
        other = cli(*command, foreign)
        assert (other.code, other.err) == (
            2, f"error: {foreign} is not a charlm checkpoint (it may come from another tool)\n")
    assert garbage.read_bytes() == b"\x00not a checkpoint" * 20


def test_eval_and_prompt_file_reject_non_utf8(cli, tiny_run, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9".encode("latin-1"))
    result = cli("eval", tiny_run, bad)
    assert (result.code, result.err) == (
        2, f"error: {bad} is not valid UTF-8 text (invalid byte 0xe9 at byte offset 3); charlm "
           "reads text files as UTF-8, convert it first\n")
    prompt = cli("sample", tiny_run, "--prompt-file", bad)
    assert (prompt.code, prompt.err) == (result.code, result.err)
    missing = cli("eval", tiny_run, tmp_path / "nope.txt")
    assert (missing.code, missing.err) == (
        2, f"error: input file not found: {tmp_path / 'nope.txt'}\n")


def test_prompt_file_is_read_as_prepare_reads_text(cli, tiny_run, tmp_path):
    """--prompt-file turned CRLF (and a lone CR) into LF, so a model trained on CRLF text saw
    another prompt than the file's, and after a byte order mark named an invalid byte 3 bytes
    early; it keeps the text as it is (here '\r' is outside the model's vocabulary)."""
    crlf = tmp_path / "crlf.txt"
    crlf.write_bytes(b"\xef\xbb\xbfFirst\r\nCitizen:")
    result = cli("sample", tiny_run, "--prompt-file", crlf, "--max-new-tokens", "5")
    assert (result.code, result.err) == (
        2, "error: prompt has characters outside the model's vocabulary: '\\r' at position 5; "
           "remove them or pass --unknown skip\n")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xef\xbb\xbfFirst\xff")
    result = cli("sample", tiny_run, "--prompt-file", bad, "--max-new-tokens", "5")
    assert (result.code, result.err) == (
        2, f"error: {bad} is not valid UTF-8 text (invalid byte 0xff at byte offset 8); charlm "
           "reads text files as UTF-8, convert it first\n")


@pytest.mark.parametrize("command", [["sample"], ["eval", ROOT / "configs" / "tiny.yaml"],
                                     ["train", "--out"]])
@pytest.mark.parametrize("device", ["tpu", "CPU"])
def test_sample_eval_and_train_reject_an_unknown_device(cli, tiny_run, command, device):
    """One message for every command (train used to name "--set overrides" for its --device)."""
    args = [ROOT / "configs" / "tiny.yaml", *command[1:], tiny_run] if command[0] == "train" \
        else [tiny_run, *command[1:]]
    result = cli(command[0], *args, "--device", device)
    assert (result.code, result.err, result.out) == (
        2, f"error: unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps\n", "")


def test_info_on_a_config_too_big_for_memory_builds_no_weights(cli):
    C, V, T, L = 1 << 17, 10, 16, 2  # 12 * C^2 float32 weights per layer: 824 GB for 2 layers
    result = cli("info", ROOT / "configs" / "tiny.yaml", "--vocab-size", V, "--json", "--shapes",
                 "--set", f"model.n_embd={C}")
    assert result.code == 0, result.err
    info = json.loads(result.out)
    assert info["parameters"]["total"] == V * C + T * C + L * (12 * C * C + 2 * C) + C


def test_info_on_a_config_of_a_billion_layers_builds_one(cli):
    """The table of a config comes from a one-layer model on the meta device (the blocks are
    alike): it built all n_layer blocks, for hours at model.n_layer=1000000000."""
    C, V, T, L = 32, 10, 16, 10**9  # tiny.yaml: 12 C^2 + 2 C parameters a block, no biases
    result = cli("info", ROOT / "configs" / "tiny.yaml", "--vocab-size", V, "--json",
                 "--set", f"model.n_layer={L}")
    assert result.code == 0, result.err
    info = json.loads(result.out)
    assert info["parameters"]["total"] == V * C + T * C + L * (12 * C * C + 2 * C) + C


@pytest.mark.parametrize("args, message", [
    (["--vocab-size", "0"], "--vocab-size must be >= 1, got 0"),
    (["--vocab-size", "-3"], "--vocab-size must be >= 1, got -3"),
    (["--shapes", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["--shapes", "--seq-len", "0"], "--seq-len 0 must be in 1..block_size (16)"),
    (["--batch", "4"], "--batch sizes the forward pass of --shapes; add --shapes"),
    (["--seq-len", "8"], "--seq-len sizes the forward pass of --shapes; add --shapes"),
])
def test_info_rejects_bad_sizes(cli, args, message):
    result = cli("info", ROOT / "configs" / "tiny.yaml", *args)
    assert (result.code, result.err, result.out) == (2, f"error: {message}\n", "")


def test_sample_default_prompt_for_a_model_without_newlines(cli, tmp_path):
    text = tmp_path / "one_line.txt"
    text.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:5000].replace("\n", " "),
                    encoding="utf-8")
    run = tmp_path / "run"
    trained = cli("train", ROOT / "configs" / "tiny.yaml", "--data", text, "--out", run,
                  "--set", "train.max_iters=2", "--set", "train.eval_iters=1")
    assert trained.code == 0, trained.err
    # No --prompt: a newline, or (as the training previews) the first character of a
    # vocabulary that has none, here the space.
    result = cli("sample", run, "--max-new-tokens", "5", "--temperature", "0")
    assert (result.code, result.err) == (0, "")
    assert result.out.startswith(" ") and len(result.out) == 1 + 5 + 1
    import charlm

    assert len(charlm.generate(charlm.load(run, "cpu"), max_new_tokens=5)) == 5


def test_ctrl_c_while_sampling_ends_the_line_and_says_interrupted(cli, tiny_run, monkeypatch):
    """Typer alone would exit 130 without a word; the CLI says `interrupted` on a line of its
    own and puts the Ctrl-C handler back."""
    import charlm.generation.text

    real = charlm.generation.text.sample_text

    def interrupted_after_20(model, vocab, text, opts, show):
        pieces = []

        def counting(i, piece):
            show(i, piece)
            pieces.append(piece)
            if len(pieces) == 20:
                os.kill(os.getpid(), signal.SIGINT)

        return real(model, vocab, text, opts, counting)

    monkeypatch.setattr(charlm.generation.text, "sample_text", interrupted_after_20)
    handler = signal.getsignal(signal.SIGINT)
    result = cli("sample", tiny_run, "--prompt", "First", "--max-new-tokens", "100000")
    assert (result.code, result.err) == (130, "\ninterrupted\n")
    assert result.out.startswith("First") and 20 <= len(result.out) - 5 < 1000
    assert signal.getsignal(signal.SIGINT) is handler


def test_info_on_a_safetensors_export_dir(cli, tiny_run, tmp_path):
    from charlm.export import save_safetensors
    from charlm.training.checkpoint import load_model

    model, vocab, cfg, _ = load_model(tiny_run)
    save_safetensors(model, vocab, cfg, tmp_path / "st")
    from_export = cli("info", tmp_path / "st", "--json")
    assert from_export.code == 0, from_export.err
    from_run = json.loads(cli("info", tiny_run, "--json").out)
    info = json.loads(from_export.out)
    assert "checkpoint" not in info
    del from_run["checkpoint"]
    assert info == from_run


def test_eval_rejects_an_unknown_policy(cli, tiny_run, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("First Citizen:\n", encoding="utf-8")
    result = cli("eval", tiny_run, text, "--unknown", "drop")
    assert (result.code, result.err, result.out) == (
        2, "error: --unknown must be 'error' or 'skip', got 'drop'\n", "")


def test_train_without_a_config_names_the_run_dir_after_the_data(cli, tmp_path, monkeypatch):
    """`charlm train --data my.txt` trains into runs/my, as `charlm train my.txt` does, not into
    the built-in default's run dir; --out or --set train.out_dir still choose."""
    monkeypatch.chdir(tmp_path)
    for name in ("mine.txt", "other.txt"):
        Path(name).write_text(SHAKESPEARE.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    small = ["--set", "train.max_iters=1", "--set", "train.eval_iters=1", "--set",
             "model.n_layer=1"]
    for args, run in ((["--data", "mine.txt"], "runs/mine"), (["other.txt"], "runs/other"),
                      (["--data", "mine.txt", "--set", "train.out_dir=elsewhere"], "elsewhere")):
        result = cli("train", *args, *small)
        assert result.code == 0, result.err
        assert result.out.rstrip().endswith(f"checkpoints in {run}")
        assert Path(run, "last.pt").is_file()
    assert sorted(p.name for p in Path("runs").iterdir()) == ["mine", "other"]


@pytest.fixture
def train_configs(monkeypatch) -> list:
    """The configs `charlm train` would train, in order; nothing is trained."""
    import charlm.training.loop

    seen = []
    monkeypatch.setattr(charlm.training.loop, "train", lambda cfg, **kw: seen.append(cfg) or
                        charlm.training.run_objects.TrainState())
    return seen


@pytest.mark.parametrize("name", ["my \U0001f600.txt", "caf\u00e9 \"x\": 1.txt", "123", "null"])
def test_train_takes_data_and_out_names_as_given(cli, tmp_path, monkeypatch, train_configs,
                                                 name):
    """--data, --out and a text file as CONFIG_OR_TEXT reach the config as the exact strings
    typed, whatever their characters (an emoji was read back as two lone surrogates, and the
    run died with a UnicodeEncodeError traceback)."""
    seen = train_configs
    monkeypatch.chdir(tmp_path)
    Path(name).write_text("some text\n", encoding="utf-8")
    for args, out in ((["--data", name, "--out", f"out {name}"], f"out {name}"),
                      ([name], str(Path("runs", Path(name).stem)))):
        result = cli("train", *args)
        assert result.code == 0, result.err
        assert (seen[-1].data.path, seen[-1].train.out_dir) == (name, out)


@pytest.mark.parametrize("name", ["MY.YAML", "my.Yml"])
def test_a_config_suffix_in_capitals_is_a_config(cli, tmp_path, corpus, train_configs, name):
    """`charlm train MY.YAML` reads the config, not the YAML text as the data to train on."""
    config = tmp_path / name
    config.write_text(f"model:\n  n_layer: 1\ndata:\n  path: {corpus}\n", encoding="utf-8")
    result = cli("train", config)
    assert result.code == 0, result.err
    assert (train_configs[-1].model.n_layer, train_configs[-1].data.path) == (1, str(corpus))
    info = cli("info", config, "--vocab-size", "10", "--json")
    assert info.code == 0, info.err
    assert json.loads(info.out)["config"]["model"]["n_layer"] == 1


@pytest.fixture
def non_ascii_model(tmp_path) -> Path:
    """An export of a random model whose every character is outside ASCII."""
    from charlm.config.schema import ModelConfig, RunConfig
    from charlm.data.vocab import Vocab
    from charlm.export import save_safetensors
    from charlm.model.gpt import GPT

    cfg = RunConfig(model=ModelConfig(block_size=16, n_layer=1, n_head=2, n_embd=16))
    save_safetensors(GPT(cfg.model, 3), Vocab(["ß", "é", "😀"]), cfg, tmp_path / "st")
    return tmp_path / "st"


def test_sample_with_stdout_closed_runs_as_into_dev_null(cli, tiny_run, monkeypatch):
    """`charlm sample RUN >&-`: Python's sys.stdout is None then; it ended in a traceback."""
    monkeypatch.setattr(sys, "stdout", None)
    result = cli("sample", tiny_run, "--max-new-tokens", "5")
    assert (result.code, result.err) == (0, "")


def test_sample_to_a_stdout_that_cannot_encode_the_text(non_ascii_model, monkeypatch):
    """PYTHONIOENCODING=ascii or a Latin-1 terminal: characters the stream cannot encode are
    written as escapes (JSON's own in --json) instead of a UnicodeEncodeError traceback."""
    import charlm
    from charlm.cli.app import main

    text = charlm.generate(charlm.load(non_ascii_model), "é😀", max_new_tokens=20, seed=1)

    def stdout_of(*args: str, encoding: str = "ascii") -> bytes:
        out = io.TextIOWrapper(io.BytesIO(), encoding=encoding)
        monkeypatch.setattr(sys, "stdout", out)
        with pytest.raises(SystemExit) as done:
            main(["sample", str(non_ascii_model), "--prompt", "é😀", "--max-new-tokens", "20",
                  "--seed", "1", *args])
        assert done.value.code == 0
        out.flush()
        return out.buffer.getvalue()

    shown = ("é😀" + text).encode("ascii", "backslashreplace") + b"\n"
    assert stdout_of() == shown
    assert stdout_of("--no-stream") == shown
    assert stdout_of(encoding="latin-1") == ("é😀" + text).encode("latin-1",
                                                                   "backslashreplace") + b"\n"
    sample = json.loads(stdout_of("--json"))
    assert (sample["prompt"], sample["text"]) == ("é😀", text)


@pytest.mark.parametrize("command, module, function, advice", [
    ("sample", "charlm.generation.text", "sample_text",
     "use a smaller --num-samples or --beams, or free memory on the device"),
    ("eval", "charlm.evaluation.scoring", "score_text",
     "free memory on the device, or score on another --device"),
])
def test_out_of_memory_outside_training_gives_that_command_s_advice(cli, monkeypatch, tiny_run,
                                                                    corpus, command, module,
                                                                    function, advice):
    """It said to shrink the model and train.batch_size, which sample and eval cannot."""
    import importlib

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    monkeypatch.setattr(importlib.import_module(module), function, oom)
    args = [command, tiny_run] + ([corpus] if command == "eval" else [])
    result = cli(*args)
    assert (result.code, result.err) == (
        2, f"error: out of memory (tried to allocate 2.00 GiB): {advice}\n")


@pytest.mark.parametrize("args, line", [
    (["train", "--bogus"], "error: No such option: --bogus"),
    (["sample"], "error: Missing argument 'RUN_DIR_OR_CKPT'. (see `charlm sample -h`)"),
    (["sample", "run", "--top-k", "1.5"], "error: Invalid value for '--top-k': "),
    (["bogus"], "error: No such command 'bogus'. (see `charlm -h`)"),
])
def test_usage_errors_are_one_line(cli, args, line):
    """Typer printed a four-line block (usage, hint, blank, error) for these."""
    result = cli(*args)
    assert result.code == 2 and result.out == ""
    assert len(result.err.splitlines()) == 1 and result.err.startswith(line), result.err


def test_charlm_alone_shows_the_commands(cli):
    result = cli()
    assert result.code == 2 and "Usage: charlm [OPTIONS] COMMAND" in result.out + result.err


@pytest.mark.parametrize("unit, dtype, line", [
    ("AVX512_BF16", "auto", "training on cpu in bfloat16 autocast (train.dtype: auto)"),
    (None, "auto", "training on cpu in float32 (train.dtype: auto)"),
    ("AMX", "float32", "training on cpu in float32 (train.dtype: float32)"),
])
def test_train_says_what_it_computes_in_once_as_it_starts(cli, tmp_path, corpus, monkeypatch,
                                                          unit, dtype, line):
    """`dtype: auto` is bf16 on one CPU and float32 on the next: a run says which, first, and a
    resume says it again, once."""
    import charlm.runtime.precision

    monkeypatch.setattr(charlm.runtime.precision, "cpu_bf16_unit", lambda: unit)
    run = tmp_path / "run"
    common = ["--set", f"train.dtype={dtype}", "--set", "train.eval_interval=2"]
    fresh = cli("train", ROOT / "configs" / "tiny.yaml", "--data", corpus, "--out", run,
                "--set", "train.max_iters=2", "--set", "optim.warmup_iters=1", *common)
    resumed = cli("train", "--out", run, "--resume", "--set", "train.max_iters=4", *common)
    for result in (fresh, resumed):
        assert result.code == 0, result.err
        lines = result.out.splitlines()
        assert lines[0] == line and lines.count(line) == 1
        assert lines[1].startswith("step 2: train " if result is fresh else "step 4: train ")
