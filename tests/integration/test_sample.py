"""`charlm sample` on a trained run: cached and uncached greedy text agree, seeds repeat, prompts
from files and stdin, stop strings, beams, JSON; and the compiled decode step."""

import dataclasses
import io
import json
import os
import re
import signal
import sys

import pytest
import torch

from charlm.config.sampling import SampleConfig
from tests.helpers import (
    RANDOM_GPT_VOCAB,
    ROOT,
    SHAKESPEARE,
    decode_ids,
    random_gpt,
)


def test_sample_cached_equals_uncached_greedy(cli, tiny_run):
    args = ["sample", tiny_run, "--prompt", "ROMEO:", "--temperature", "0",
            "--max-new-tokens", "11"]  # block 16: the whole first window
    cached, uncached = cli(*args), cli(*args, "--no-cache")
    assert cached.code == 0 and cached.err == ""
    assert cached.out == uncached.out
    assert cached.out.startswith("ROMEO:") and len(cached.out) == len("ROMEO:") + 11 + 1


def test_sample_compile_says_how_long_the_compile_took(cli, run_dir, monkeypatch):
    """`charlm sample --compile` prints the same text as eager decoding and, on stderr, the time
    the decode step's graph took to build and a step of it against an eager step, timed after
    the build without changing a token (a stand-in backend here, which needs no C++)."""
    from charlm.generation import compiled_step

    step = torch.compile(compiled_step.decode_one_token, backend=lambda gm, _: gm.forward,
                         dynamic=False, fullgraph=True)
    monkeypatch.setattr(compiled_step, "compiled_decode_step", lambda: step)
    monkeypatch.setattr(compiled_step, "BUILT", set())
    args = ["sample", run_dir, "--prompt", "ROMEO:", "--temperature", "0",
            "--max-new-tokens", "30"]
    compiled, eager = cli(*args, "--compile"), cli(*args)
    assert compiled.code == 0 and compiled.out == eager.out
    assert re.fullmatch(r"compiled the decode step in \d+\.\d s; a step of 1 row takes "
                        r"\d+\.\d\d ms against eager's \d+\.\d\d ms \(\d+\.\d\dx"
                        r"(: slower than eager on this machine)?\)\n", compiled.err)


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
     "error: --compile needs the KV cache: it compiles the cached decode step\n"),
])
def test_sample_rejects_bad_options(cli, tiny_run, args, message):
    result = cli("sample", tiny_run, *args)
    assert (result.code, result.err) == (2, message)


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
    # the whole prompt is printed; only what the model sees is cut
    assert result.out.startswith("a" * 40) and len(result.out) == 40 + 3 + 1
    assert result.out[40:] == cli("sample", tiny_run, "--prompt", "a" * 16,
                                  "--max-new-tokens", "3").out[16:]


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

    def interrupted_after_20(model, vocab, text, opts, show, stop=None):
        pieces = []

        def counting(i, piece):
            show(i, piece)
            pieces.append(piece)
            if len(pieces) == 20:
                os.kill(os.getpid(), signal.SIGINT)

        return real(model, vocab, text, opts, counting, stop)

    monkeypatch.setattr(charlm.generation.text, "sample_text", interrupted_after_20)
    handler = signal.getsignal(signal.SIGINT)
    result = cli("sample", tiny_run, "--prompt", "First", "--max-new-tokens", "100000")
    assert (result.code, result.err) == (130, "\ninterrupted\n")
    assert result.out.startswith("First") and 20 <= len(result.out) - 5 < 1000
    assert signal.getsignal(signal.SIGINT) is handler


def test_sample_with_stdout_closed_runs_as_into_dev_null(cli, tiny_run, monkeypatch):
    """`charlm sample RUN >&-`: Python's sys.stdout is None then; it ended in a traceback."""
    monkeypatch.setattr(sys, "stdout", None)
    result = cli("sample", tiny_run, "--max-new-tokens", "5")
    assert (result.code, result.err) == (0, "")


def test_compiled_decode_step_decodes_what_eager_does(capsys):
    """torch.compile of the one-token step (CPU inductor here): the same greedy tokens and the
    same seeded samples as the eager decoder, past the first window (re-prefills stay eager)
    and for a new batch size, whose graph is built once and said so on stderr."""
    model = random_gpt()
    for batch in (2, 3):
        prompt = torch.randint(0, RANDOM_GPT_VOCAB, (batch, 5))
        for temperature in (0.0, 0.9):
            opts = SampleConfig(temperature=temperature)
            eager = decode_ids(model, prompt, 40, opts, torch.Generator().manual_seed(0))
            compiled = decode_ids(model, prompt, 40, dataclasses.replace(opts, compile=True),
                           torch.Generator().manual_seed(0))
            err = capsys.readouterr().err
            if "warning: torch.compile failed" in err:
                pytest.skip(f"torch.compile cannot build here: {err.strip()}")
            assert torch.equal(compiled, eager)
            lines = err.splitlines()  # none where this process built the graph already
            assert all(line.startswith("compiled the decode step in ") for line in lines)
            assert len(lines) <= (1 if temperature == 0 else 0)
