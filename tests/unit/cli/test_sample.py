"""`charlm sample` without a trained run: its options' help, an export of random weights written
to a stdout that cannot encode it, and the errors before any model is loaded."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import torch


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


def test_sample_missing_checkpoint(cli, tmp_path):
    result = cli("sample", tmp_path / "nope")
    assert (result.code, result.err) == (
        2, f"error: no such run dir or checkpoint: {tmp_path / 'nope'}\n")


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


def test_translations_as_json_on_a_stdout_that_cannot_encode_them(monkeypatch):
    """--json on an ASCII stdout: an encoder-decoder's lines stay JSON (its own escapes), not
    the stream's backslash escapes, which no JSON reader takes."""
    import charlm.generation.seq2seq as seq2seq
    from charlm.cli.sample import print_translations
    from charlm.config.sampling import SampleConfig

    answer = {"source": "café", "outputs": [{"text": "k æ f é 😀"}]}

    class Translation:
        outputs = [("k æ f é 😀", 0.0)]

        def as_dict(self) -> dict:
            return answer

    monkeypatch.setattr(seq2seq, "translate", lambda *args: [Translation()])
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="backslashreplace")
    monkeypatch.setattr(sys, "stdout", out)
    print_translations(None, None, ["café"], SampleConfig(), json_out=True)
    out.flush()
    assert json.loads(out.buffer.getvalue().decode("ascii")) == answer


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["sample", "eval"])
def test_sample_and_eval_without_cuda_name_their_own_option(fails, tmp_path, corpus, command):
    run = tmp_path / "run"
    run.mkdir()
    extra = [corpus] if command == "eval" else []
    fails(command, run, *extra, "--device", "cuda",
          message="--device is 'cuda' but no CUDA GPU is available to this torch build; use "
                  "cpu (or auto), or install a CUDA build of torch")


def test_prompt_file_that_is_a_directory(fails, tmp_path):
    fails("sample", tmp_path, "--prompt-file", tmp_path,
          message=f"prompt file {tmp_path} is a directory; give a text file")


def test_an_endless_prompt_on_stdin_is_one_error(cli, monkeypatch, tmp_path):
    """`yes | charlm sample RUN --prompt -` read stdin until a MemoryError (or the OOM killer)."""
    from tests.helpers import endless_stdin

    monkeypatch.setattr(sys, "stdin", endless_stdin())
    result = cli("sample", tmp_path, "--prompt", "-")
    assert (result.code, result.out, result.err) == (
        2, "", "error: cannot read the prompt on stdin: it holds more than 4 MiB, charlm's limit "
               "for it; give a smaller one\n")


def test_a_prompt_file_that_is_a_fifo_a_device_or_too_large_is_one_error(fails, tmp_path):
    """A FIFO was "not found"; a symlink to /dev/zero, or a file of gigabytes, was read whole."""
    import os

    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # sparse: nothing is written
        f.truncate((4 << 20) + 1)
    fails("sample", tmp_path, "--prompt-file", big,
          message=f"cannot read prompt file {big}: it holds more than 4 MiB, charlm's limit for "
                  "it; give a smaller one")
    not_regular = "not a regular file (a directory, FIFO or device); give a regular file"
    os.mkfifo(tmp_path / "fifo")
    fails("sample", tmp_path, "--prompt-file", tmp_path / "fifo",
          message=f"cannot read prompt file {tmp_path / 'fifo'}: {not_regular}")
    (tmp_path / "zero").symlink_to("/dev/zero")
    fails("sample", tmp_path, "--prompt-file", tmp_path / "zero",
          message=f"cannot read prompt file {tmp_path / 'zero'}: {not_regular}")


def test_a_prompt_file_in_a_symlink_loop_says_so(fails, tmp_path):
    """A symlink loop was "prompt file not found"; the file is there, its links go round."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    fails("sample", tmp_path, "--prompt-file", tmp_path / "a",
          message=f"cannot read prompt file {tmp_path / 'a'}: a symlink loop (too many levels of "
                  "symbolic links); fix or remove the link")


def test_a_source_file_that_is_a_device_is_not_called_missing(tmp_path):
    """`--source-file /dev/zero` was "source file not found (or not a file)"."""
    from charlm.cli.sample import read_sources
    from charlm.core.errors import CharlmError

    with pytest.raises(CharlmError) as e:
        read_sources(None, Path("/dev/zero"), "encoder_decoder")
    assert str(e.value) == ("cannot read source file /dev/zero: not a regular file (a directory, "
                            "FIFO or device); give a regular file")
