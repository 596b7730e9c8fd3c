"""`charlm sample RUN --interactive`: a prompt loop over a model loaded once, each line a prompt
continued as `charlm sample --prompt LINE` would, or a `/command` that changes the options.
Ctrl-C stops a generation (or clears the line being typed), Ctrl-D ends the loop."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from charlm.cli.options import SAMPLE_FIELDS
from charlm.config.sampling import SampleConfig
from charlm.config.yaml_files import PlainScalar
from charlm.core.errors import CharlmError
from charlm.core.files import temp_beside

PROMPT = "> "
HISTORY = ".charlm_history"  # under the user's home
HISTORY_LINES = 1000

# The options a `/command` may change; the others (samples, beams, stop strings, the cache,
# compile) stay as the command line gave them for the whole session.
SETTABLE = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
            "repetition_window", "max_new_tokens", "seed")

CONFLICTS = {  # what cannot go with --interactive, and why
    "--prompt": "it reads each prompt from the terminal",
    "--prompt-file": "it reads each prompt from the terminal",
    "--source": "it continues prompts with a GPT",
    "--source-file": "it continues prompts with a GPT",
    "--num-samples": "it streams one sample per prompt",
    "--beams": "it streams each sample as it is drawn, and beam search has no text until its end",
    "--json": "it prints text for a person to read",
}

# Generate from a prompt line with these options, stopping early once the callable says so.
Generate = Callable[[str, SampleConfig, Callable[[], bool]], None]


def refuse_conflicts(given: Iterable[str]) -> None:
    for option in given:
        if option in CONFLICTS:
            raise CharlmError(f"--interactive cannot go with {option}: {CONFLICTS[option]}; "
                              f"drop {option}, or drop --interactive to sample once")


def shown(value: object) -> str:
    """An option's value as a command takes it back (`null` for off)."""
    return "null" if value is None else str(value)


def help_text(opts: SampleConfig) -> str:
    width = max(map(len, SETTABLE)) + 8
    lines = ["Type a prompt and Enter: the model continues it. A line that starts with / is a "
             "command (start a prompt with // to begin it with /):"]
    lines += [f"  /{name + ' VALUE':<{width}} {SAMPLE_FIELDS[name].metadata['help']} "
              f"Now {shown(getattr(opts, name))}." for name in SETTABLE]
    lines += [f"  /{'NAME':<{width}} show an option's value (null is off, for top_k, top_p "
              "and min_p)",
              f"  /{'reset':<{width}} the options as the command line gave them",
              f"  /{'help':<{width}} this list",
              "Ctrl-C stops a generation (or clears the line); Ctrl-D exits."]
    return "\n".join(lines)


def run_command(line: str, opts: SampleConfig, start: SampleConfig) -> tuple[SampleConfig, str]:
    """A `/command` applied to `opts` (`start`: what /reset restores): the new options, a reply."""
    name, _, value = line.removeprefix("/").strip().partition(" ")
    name, value = name.replace("-", "_"), value.strip()
    if name in ("help", "reset") and value:
        raise CharlmError(f"/{name} takes no value, got {value!r}; type /{name} alone")
    if name == "help":
        return opts, help_text(opts)
    if name == "reset":
        return start, "options reset: " + ", ".join(
            f"{n} {shown(getattr(start, n))}" for n in SETTABLE)
    if name not in SETTABLE:
        raise CharlmError(f"unknown command /{name}; /help lists the commands")
    if value:
        # read as `--set` reads a value (`PlainScalar`): SampleConfig types and checks it
        opts = dataclasses.replace(opts, **{name: PlainScalar(value)})
    return opts, f"{name} {shown(getattr(opts, name))}"


class CtrlC:
    """SIGINT in the loop: at the prompt a KeyboardInterrupt (input() ends, the line cleared);
    else it sets `pressed`, which the generation asks after each character."""

    def __init__(self) -> None:
        self.at_prompt = False
        self.pressed = False

    def __call__(self, signum: int, frame: object) -> None:
        if self.at_prompt:
            raise KeyboardInterrupt
        self.pressed = True


def read_line(ctrl_c: CtrlC, prompt: str, read: Callable[[str], str]) -> str | None:
    """The next line typed, or None at the end of input (Ctrl-D); Ctrl-C asks again."""
    while True:
        try:
            ctrl_c.at_prompt = True
            try:
                return read(prompt)
            finally:
                ctrl_c.at_prompt = False
        except KeyboardInterrupt:
            print(flush=True)  # the terminal echoed ^C: the next prompt on a line of its own
        except EOFError:
            if prompt:
                print(flush=True)
            return None


def prompt_loop(generate: Generate, opts: SampleConfig, read: Callable[[str], str] = input,
                history: Path | None = None) -> None:
    """Each line a `/command` or a prompt for `generate`; a bad one is an `error:` line."""
    start, ctrl_c = opts, CtrlC()
    # a person at a terminal: a prompt, and input() edits lines with readline (it does only
    # when both are terminals); fed from a file, the output is the samples alone
    interactive = all(s is not None and s.isatty() for s in (sys.stdin, sys.stdout))
    readline = None
    if interactive and read is input:
        history = history or Path.home() / HISTORY
        readline = load_history(history)
    if interactive:
        print("Type a prompt to continue it; /help lists the commands, Ctrl-D exits.",
              file=sys.stderr)
    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:
        while (line := read_line(ctrl_c, PROMPT if interactive else "", read)) is not None:
            try:
                if line.startswith("/") and not line.startswith("//"):
                    opts, said = run_command(line, opts, start)
                    print(said, flush=True)
                elif line:
                    ctrl_c.pressed = False
                    generate(line.removeprefix("/"), opts, lambda: ctrl_c.pressed)
            except CharlmError as e:
                print(f"error: {e}", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGINT, previous)
        if readline is not None:
            save_history(readline, history)


def load_history(path: Path):
    """The readline module (None where Python has none) with `path`'s history loaded, if it is
    a readable regular file (a FIFO's read would wait for a writer)."""
    try:
        import readline
    except ImportError:
        return None
    readline.set_history_length(HISTORY_LINES)
    if path.is_file():
        with contextlib.suppress(OSError):
            readline.read_history_file(path)
    return readline


def save_history(readline, path: Path) -> None:
    """Write the history through a temporary file beside `path`, so a failed write leaves the
    old one; a failure (a read-only home) or a `path` that is no regular file is ignored."""
    if path.exists() and not path.is_file():
        return
    tmp = temp_beside(path)
    try:
        readline.write_history_file(tmp)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
