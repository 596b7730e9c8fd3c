"""`charlm` itself (charlm.cli.app): every command's help, usage errors, and a failure of any
command as one `error:` line, printed once per machine under torchrun."""

import contextlib
import errno
import os
import signal

import pytest
import torch

from charlm.cli import app as cli
from charlm.core import files
from charlm.core.files import write_text_atomic
from tests.helpers import COMMANDS, ROOT


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(cli, command):
    result = cli(command, "--help")
    assert result.code == 0
    assert f"Usage: charlm {command}" in result.out


def test_help_names_arguments_as_the_readme_does(cli):
    assert "{RUN_DIR_OR_CKPT} [TEXT_FILE]" in cli("eval", "--help").out
    assert "the built-in defaults, a small GPT-2" in " ".join(cli("train", "--help").out.split())


@pytest.mark.parametrize("command", ["train", "sample", "eval"])
def test_device_help_lists_the_devices_the_readme_does(cli, command):
    """train's --device help said 'auto, cpu, cuda or mps', without cuda:N, which it takes."""
    assert "--device DEVICE auto, cpu, cuda (the first GPU), cuda:N or mps" in " ".join(
        cli(command, "--help").out.split())


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


def test_the_cli_reports_a_failed_atomic_write_with_the_target(tmp_path, monkeypatch, capsys):
    path = tmp_path / "config.yaml"

    def disk_full(file, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))

    monkeypatch.setattr(files, "open", disk_full, raising=False)
    monkeypatch.setattr(cli, "app", lambda **kwargs: write_text_atomic(path, "x"))
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"error: No space left on device: {path}\n"


@pytest.mark.parametrize("signum, code, line", [(signal.SIGINT, 130, "\ninterrupted\n"),
                                                (signal.SIGTERM, 143, "interrupted by SIGTERM\n")])
def test_a_stop_signal_outside_training_is_one_line_and_its_exit_code(monkeypatch, capsys, signum,
                                                                       code, line):
    """SIGTERM kept its default outside training: the process died where it stood (in the
    middle of `prepare`, leaving its temporaries) without a word. Both signals now unwind the
    command as an error would, and exit 128 + their number; the handlers come back after. The
    handlers are set as a terminal's foreground job has them first: a background job of a
    shell inherits SIGINT ignored, which main leaves alone (the next test)."""
    defaults = signal.default_int_handler, signal.SIG_DFL

    def command(**kwargs):  # the signal arrives: Python calls the handler main installed
        handler = signal.getsignal(signum)
        assert callable(handler), "the default: the process would die here"
        handler(signum, None)

    monkeypatch.setattr(cli, "app", command)
    with handlers(*defaults):
        with pytest.raises(SystemExit) as e:
            cli.main(["prepare"])
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == defaults
    assert (e.value.code, capsys.readouterr().err) == (code, line)


def test_an_ignored_stop_signal_stays_ignored(monkeypatch):
    """`nohup` or a shell's background job starts charlm with SIGINT and SIGTERM ignored: the
    command runs with them ignored still, as the caller asked."""
    seen = []
    monkeypatch.setattr(cli, "app", lambda **kwargs: seen.append(
        (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))))
    with handlers(signal.SIG_IGN, signal.SIG_IGN), pytest.raises(SystemExit) as e:
        cli.main(["prepare"])
    assert e.value.code == 0 and seen == [(signal.SIG_IGN, signal.SIG_IGN)]


@contextlib.contextmanager
def handlers(on_int, on_term):
    """SIGINT and SIGTERM handled by on_int and on_term within; as they were after."""
    inherited = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGINT, on_int)
    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, inherited[0])
        signal.signal(signal.SIGTERM, inherited[1])


@pytest.mark.parametrize("command", [["prepare", "--out", "data"], ["sample", "run",
                                                                      "--prompt-file"]])
def test_a_path_with_a_newline_and_an_escape_sequence_stays_on_the_error_line(cli, tmp_path,
                                                                               monkeypatch,
                                                                               command):
    """A file name holding a newline broke the one-line error, and one holding `ESC [2J`
    reached the terminal raw and cleared the screen: every control character is escaped."""
    monkeypatch.chdir(tmp_path)
    name = "bad\nname\x1b[2J.txt"
    result = cli(*command, name) if command[0] == "sample" else cli(command[0], name,
                                                                     *command[1:])
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith("error: ") and result.err.count("\n") == 1
    assert "bad\\nname\\x1b[2J.txt" in result.err and "\x1b" not in result.err


@pytest.mark.parametrize("rank, local_rank, prints", [(1, 1, False), (8, 0, True)])
def test_bad_input_is_printed_by_the_first_process_of_each_machine(rank, local_rank, prints,
                                                                   cli, monkeypatch):
    """The processes of a torchrun world fail alike: one error line per machine, not one per
    process (rank 8 with local rank 0: the first process of a second machine)."""
    for key, value in {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": 16}.items():
        monkeypatch.setenv(key, str(value))
    result = cli("train", ROOT / "configs" / "tiny.yaml", "--set", "train.max_iters=0")
    message = "error: invalid config value train.max_iters: must be >= 1\n"
    assert (result.code, result.out, result.err) == (2, "", message if prints else "")
