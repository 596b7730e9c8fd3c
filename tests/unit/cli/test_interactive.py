"""`charlm sample --interactive` without a model: the `/command` parser, the options it refuses
beside --interactive, and the loop over lines given by a fake reader (the real terminal is
tests/integration/test_interactive.py's)."""

from __future__ import annotations

import os
import signal
import stat
import sys
import types

import pytest

from charlm.cli.interactive import (
    SETTABLE,
    load_history,
    prompt_loop,
    run_command,
    save_history,
)
from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError

START = SampleConfig(temperature=0.5, top_k=20)


def test_a_command_sets_one_option_and_says_its_new_value():
    opts, said = run_command("/temperature 0", START, START)
    assert (opts.temperature, said) == (0.0, "temperature 0.0")
    assert START.temperature == 0.5  # the options before stay as they were
    opts, said = run_command("/top-k   null ", opts, START)  # a hyphen as on the command line
    assert (opts.top_k, opts.temperature, said) == (None, 0.0, "top_k null")
    opts, said = run_command("/max_new_tokens 1_000", opts, START)  # read as --set reads it
    assert (opts.max_new_tokens, said) == (1000, "max_new_tokens 1000")
    assert run_command("/seed", opts, START) == (opts, "seed 1337")  # no value: show it


def test_reset_goes_back_to_the_command_line_s_options():
    opts, _ = run_command("/seed 1", START, START)
    opts, _ = run_command("/top_p 0.9", opts, START)
    back, said = run_command("/reset", opts, START)
    assert back is START
    assert said == ("options reset: temperature 0.5, top_k 20, top_p null, min_p null, "
                    "repetition_penalty 1.0, repetition_window 64, max_new_tokens 500, "
                    "seed 1337")


def test_help_lists_every_command_with_its_help_and_value():
    opts, text = run_command("/help", START, START)
    assert opts is START
    lines = text.splitlines()
    for name in SETTABLE:
        [line] = [line for line in lines if line.startswith(f"  /{name} VALUE ")]
        assert f"Now {'null' if getattr(START, name) is None else getattr(START, name)}." in line
    assert "  /temperature VALUE          Softmax temperature; 0 is greedy. Now 0.5." in lines
    assert any(line.startswith("  /reset ") for line in lines)
    assert lines[-1] == "Ctrl-C stops a generation (or clears the line); Ctrl-D exits."


@pytest.mark.parametrize("line, message", [
    ("/nope 3", "unknown command /nope; /help lists the commands"),
    ("/", "unknown command /; /help lists the commands"),
    ("/num_samples 2", "unknown command /num_samples; /help lists the commands"),
    ("/temperature -1", "temperature must be >= 0 (0 is greedy), got -1.0"),
    ("/temperature warm", "invalid value for temperature: 'warm', expected a number"),
    ("/top_p 2", "top_p must be in (0, 1], got 2.0"),
    ("/seed 1.5", "invalid value for seed: 1.5, expected an integer"),
    ("/reset now", "/reset takes no value, got 'now'; type /reset alone"),
])
def test_a_bad_command_or_value_is_one_error(line, message):
    with pytest.raises(CharlmError) as e:
        run_command(line, START, START)
    assert str(e.value) == message


@pytest.mark.parametrize("args, option, why", [
    (["--prompt", "x"], "--prompt", "it reads each prompt from the terminal"),
    (["--prompt-file", "p.txt"], "--prompt-file", "it reads each prompt from the terminal"),
    (["--source", "x"], "--source", "it continues prompts with a GPT"),
    (["--num-samples", "2"], "--num-samples", "it streams one sample per prompt"),
    (["--beams", "3"], "--beams", "it streams each sample as it is drawn, and beam search has "
                                  "no text until its end"),
    (["--json"], "--json", "it prints text for a person to read"),
])
def test_interactive_refuses_what_it_cannot_do_before_loading(fails, tmp_path, args, option, why):
    fails("sample", tmp_path / "no-run", "--interactive", *args,
          message=f"--interactive cannot go with {option}: {why}; drop {option}, or drop "
                  "--interactive to sample once")


def run_loop(lines: list[str], generate, capsys) -> tuple[str, str]:
    """prompt_loop over `lines` (then the end of input); its stdout and stderr. A line that is
    KeyboardInterrupt stands for a Ctrl-C while typing."""
    feed = iter(lines)

    def read(prompt: str) -> str:
        line = next(feed, EOFError)
        if isinstance(line, type) and issubclass(line, BaseException):
            raise line
        return line

    prompt_loop(generate, START, read)
    out = capsys.readouterr()
    return out.out, out.err


def test_the_loop_generates_from_prompts_with_the_options_of_the_moment(capsys):
    calls = []
    handler = signal.getsignal(signal.SIGINT)
    out, err = run_loop(["First", "/temperature 0", "", "//x", KeyboardInterrupt, "/bad",
                         "Second"],
                        lambda line, opts, stop: calls.append((line, opts.temperature)), capsys)
    assert calls == [("First", 0.5), ("/x", 0.0), ("Second", 0.0)]
    assert out == "temperature 0.0\n\n"  # the reply; a newline after Ctrl-C
    assert err == "error: unknown command /bad; /help lists the commands\n"
    assert signal.getsignal(signal.SIGINT) is handler


def test_ctrl_c_during_a_generation_asks_it_to_stop_and_the_loop_goes_on(capsys):
    seen = []

    def generate(line, opts, stop):
        seen.append(stop())
        if line == "long":
            os.kill(os.getpid(), signal.SIGINT)  # as the terminal's Ctrl-C would
            seen.append(stop())
        if line == "bad":
            raise CharlmError("prompt has characters outside the model's vocabulary")

    out, err = run_loop(["long", "bad", "next"], generate, capsys)
    assert seen == [False, True, False, False]  # each generation starts unstopped
    assert err == "error: prompt has characters outside the model's vocabulary\n"


def test_interactive_refuses_an_encoder_decoder(fails, tmp_path):
    """It continues prompts; an encoder-decoder transduces sources (`--source`)."""
    from charlm.config.data import DataConfig
    from charlm.config.schema import RunConfig
    from charlm.data.pairs import PairVocab
    from charlm.export import save_safetensors
    from charlm.training.tasks import build_model
    from tests.helpers import seq2seq_config

    cfg = RunConfig(model=seq2seq_config(), data=DataConfig(format="pairs"))
    vocab = PairVocab.from_pairs([("ab", "ba"), ("abc", "cba")], "char")
    save_safetensors(build_model(cfg, vocab), vocab, cfg, tmp_path / "st")
    fails("sample", tmp_path / "st", "--interactive",
          message=f"--interactive continues prompts with a GPT; {tmp_path / 'st'} is an "
                  "encoder-decoder: drop --interactive and transduce with --source or "
                  "--source-file")


def test_a_fifo_as_the_history_file_is_neither_read_nor_replaced(tmp_path, monkeypatch):
    """A FIFO at ~/.charlm_history hung `--interactive` before its first prompt: readline's
    read waited for a writer that never came (holding the GIL: a fake readline records what
    is read and written instead)."""
    used: list[str] = []
    fake = types.SimpleNamespace(set_history_length=lambda n: None,
                                 read_history_file=lambda p: used.append(f"read {p}"),
                                 write_history_file=lambda p: used.append(f"write {p}"))
    monkeypatch.setitem(sys.modules, "readline", fake)
    fifo = tmp_path / ".charlm_history"
    os.mkfifo(fifo)
    assert load_history(fifo) is fake
    save_history(fake, fifo)
    assert used == [] and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert os.listdir(tmp_path) == [".charlm_history"]
    fifo.unlink()
    fifo.write_text("old\n")  # a regular file is still read
    load_history(fifo)
    assert used == [f"read {fifo}"]
