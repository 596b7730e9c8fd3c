"""`charlm sample RUN --interactive` as a person uses it: a real process on a pseudo-terminal
that is its controlling terminal, so line editing is readline's and Ctrl-C (\\x03) reaches it as
the terminal's SIGINT, and Ctrl-D (\\x04) as the end of input."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest


class Terminal:
    """`charlm sample RUN --interactive ARGS` on a new pseudo-terminal, HOME at `home`."""

    def __init__(self, run: Path, *args: str, home: Path):
        master, slave = os.openpty()
        env = {k: v for k, v in os.environ.items() if k != "INPUTRC"}
        # TERM=dumb: readline edits lines without escape sequences (bracketed paste and such)
        env.update(HOME=str(home), TERM="dumb", OMP_NUM_THREADS="1")
        self.fd = master
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "charlm", "sample", str(run), "--interactive", *args],
            stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True,
            preexec_fn=take_terminal)
        os.close(slave)
        self.pending = ""

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def read(self, until: str, timeout: float = 30) -> str:
        """What the terminal shows up to and including `until`, newlines as "\\n"."""
        end = time.monotonic() + timeout
        while until not in self.pending:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise AssertionError(f"no {until!r} within {timeout} s; the terminal shows "
                                     f"{self.pending[-2000:]!r}")
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO: the process ended and the terminal closed
                data = b""
            if not data:
                raise AssertionError(f"the process ended before {until!r}; the terminal shows "
                                     f"{self.pending[-2000:]!r}")
            self.pending += data.decode(errors="replace").replace("\r\n", "\n")
        at = self.pending.index(until) + len(until)
        shown, self.pending = self.pending[:at], self.pending[at:]
        return shown

    def ctrl_c_at_prompt(self) -> str:
        """Ctrl-C at the prompt, until the next prompt shows. CPython's readline hook takes a
        signal only when its select() is interrupted: one that lands while it handles a key
        (a window a busy machine widens) waits for the next key, as a person would press
        Ctrl-C again."""
        for _ in range(20):
            self.send("\x03")
            try:
                return self.read("\n> ", timeout=1.5)
            except AssertionError:
                continue
        raise AssertionError(f"no prompt after 20 Ctrl-C; the terminal shows {self.pending!r}")

    def ask(self, line: str) -> str:
        """Type `line` and Enter; what shows until the next prompt, without the echoed line."""
        self.send(line + "\r")
        shown = self.read("\n> ")
        assert shown.startswith(line + "\n"), shown
        return shown[len(line) + 1: -len("> ")]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.fd)


def take_terminal() -> None:
    """In the child, a session leader: make its stdin, the pseudo-terminal, its controlling
    terminal, so the terminal's Ctrl-C signals it."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.fixture
def terminal(tmp_path):
    opened = []

    def start(run: Path, *args: str) -> Terminal:
        opened.append(Terminal(run, *args, home=tmp_path))
        opened[-1].read("> ")  # the greeting, then the first prompt: the model is loaded
        return opened[-1]

    yield start
    for t in opened:
        t.close()


def test_interactive_prompts_sample_as_charlm_sample_with_the_options_commands_set(
        cli, tiny_run, tmp_path, terminal):
    """Options given on the command line are the starting values; /temperature and /seed change
    them, /reset restores them; each prompt's text equals `charlm sample --prompt`'s with the
    options at the time; a bad command or value is one error line and the loop goes on; Ctrl-D
    exits 0 and the history is written to ~/.charlm_history."""
    def sample(*options: str) -> str:
        result = cli("sample", tiny_run, "--prompt", "First", "--max-new-tokens", "40", *options)
        assert (result.code, result.err) == (0, "")
        return result.out

    greedy, seeded = sample("--temperature", "0"), sample("--temperature", "1.5", "--seed", "7")
    assert greedy != seeded
    t = terminal(tiny_run, "--temperature", "0", "--max-new-tokens", "40")
    assert t.ask("First") == greedy
    assert t.ask("/temperature 1.5") == "temperature 1.5\n"
    assert t.ask("/seed 7") == "seed 7\n"
    assert t.ask("First") == seeded
    assert t.ask("/nope") == "error: unknown command /nope; /help lists the commands\n"
    assert t.ask("/top_k 0") == "error: top_k must be >= 1, got 0\n"
    assert t.ask("Fir#") == ("error: prompt has characters outside the model's vocabulary: "
                                 "'#' at position 3; remove them or pass --unknown skip\n")
    assert t.ask("/reset").startswith("options reset: temperature 0.0, top_k null, ")
    assert t.ask("First") == greedy
    t.send("\x04")
    assert t.proc.wait(timeout=10) == 0
    assert (tmp_path / ".charlm_history").read_text().splitlines()[-3:] == [
        "Fir#", "/reset", "First"]


def test_ctrl_c_stops_a_generation_and_clears_a_line_but_not_the_loop(tiny_run, terminal):
    """Ctrl-C during a generation of a million characters ends it where it is (its text stays,
    then a newline and the prompt); Ctrl-C while typing drops the line; Ctrl-D exits 0."""
    t = terminal(tiny_run, "--max-new-tokens", "1000000")
    t.send("lost words")
    t.read("lost words")  # readline has it
    t.ctrl_c_at_prompt()
    t.send("First\r")
    t.read("First\nFirst")  # the echoed line, then the sample streaming after its prompt
    started = time.monotonic()
    t.read("\n")  # some of the text has streamed
    t.send("\x03")
    text = t.read("\n> ", timeout=10)
    assert time.monotonic() - started < 10 and t.proc.poll() is None
    assert "error" not in text and "interrupted" not in text and "Traceback" not in text
    assert t.ask("/max_new_tokens 5") == "max_new_tokens 5\n"
    shown = t.ask("First")  # the loop goes on; the line typed before Ctrl-C is gone
    assert shown.startswith("First") and len(shown) == len("First") + 5 + 1
    t.send("\x04")
    assert t.proc.wait(timeout=10) == 0
