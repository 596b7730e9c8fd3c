"""The `charlm` command line: the root app, which imports a command's module only when the
command runs (or `--help` lists it), and `main`, which ends bad input with one `error:` line:
out-of-memory advice, SIGINT and SIGTERM outside training, a stdout that never raises on a
character it cannot encode."""

from __future__ import annotations

import importlib
import io
import os
import re
import signal
import sys
from typing import Annotated

import typer
import typer.core
import typer.main

from charlm.core.errors import CharlmError, SettingError, printable
from charlm.core.ranks import reports_errors

COMMANDS = ("prepare", "train", "sample", "info", "eval", "export", "tune", "serve")

OUT_OF_MEMORY_ADVICE = {  # what each command can make smaller
    "train": "make the model (model.n_layer, model.n_embd), train.batch_size or model.block_size "
             "smaller",
    "sample": "use a smaller --num-samples or --beams, or free memory on the device",
    "eval": "score a shorter text (split the file), free memory on the device, or score on "
            "another --device",
}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class LazyGroup(typer.core.TyperGroup):
    """Each command the function of its name in `charlm.cli.<name>` (`eval_` for eval)."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: typer.Context, name: str):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"charlm.cli.{name}")
        one = typer.Typer(add_completion=False, rich_markup_mode=None)
        one.command(name)(getattr(module, name, None) or getattr(module, f"{name}_"))
        return typer.main.get_command(one)


app = typer.Typer(
    cls=LazyGroup,
    name="charlm",
    help="Train character-level GPT language models on any text file, and sample from them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    """charlm: prepare text, train a GPT on it, sample from the checkpoints."""


def error_message(e: CharlmError | OSError) -> str:
    """What the `error:` line says: a setting by its flag, a file error with its file."""
    from charlm.cli.options import flag

    if isinstance(e, SettingError):
        return e.calling(flag)
    if isinstance(e, CharlmError):
        return str(e)
    return f"{e.strerror or e}: {e.filename}" if e.filename else f"{e.strerror or e}"


def report(line: str) -> None:
    """An error line on stderr, control characters escaped, once per machine under torchrun."""
    if reports_errors():
        print(printable(line), file=sys.stderr)


class Interrupt(BaseException):
    """SIGINT or SIGTERM outside training (which stops on its own): raised where the command
    is, it unwinds it as an error would, each `finally` removing what it half-wrote; the
    process then exits 128 + the signal's number, as a shell counts it."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum

    def line(self) -> str:
        """What stderr shows: after a Ctrl-C on a line of its own (the terminal echoed ^C)."""
        if self.signum == signal.SIGINT:
            return "\ninterrupted"
        return f"interrupted by {signal.Signals(self.signum).name}"


def raise_interrupt(signum: int, frame: object) -> None:
    raise Interrupt(signum)


def out_of_memory_line(e: BaseException, command: str) -> str | None:
    """The `error:` line for a failed allocation (CUDA's OutOfMemoryError, the CPU allocator's,
    a MemoryError): its size and what `command` can make smaller; None for another error."""
    if not (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or "can't allocate memory" in str(e)):
        return None
    tried = re.search(r"[Tt]ried to allocate (\d[\d.]* ?\w*)", str(e))
    return (f"error: out of memory{f' (tried to allocate {tried[1]})' if tried else ''}: "
            f"{OUT_OF_MEMORY_ADVICE.get(command, OUT_OF_MEMORY_ADVICE['train'])}")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    # A closed stdout (`>&-`) goes to /dev/null, and one that cannot encode every character (a
    # Latin-1 terminal) writes the others as escapes, as stderr does, not a traceback.
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process's)
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        sys.stdout.reconfigure(errors="backslashreplace")
    # Typer turns KeyboardInterrupt into a silent exit 130, and SIGTERM's default ends the
    # process where it stands (leaving its temporary files): both raise Interrupt instead. A
    # signal set to be ignored (a shell's background job) or handled by the caller stays so.
    defaults = (signal.default_int_handler, signal.SIG_DFL)
    replaced = {sig: handler for sig in STOP_SIGNALS
                if (handler := signal.getsignal(sig)) in defaults}
    for sig in replaced:
        signal.signal(sig, raise_interrupt)
    try:
        code = app(args=argv, prog_name="charlm", standalone_mode=False)
    except typer.TyperException as e:  # a usage error (an unknown option); `charlm` alone: help
        where = e.ctx.command_path if getattr(e, "ctx", None) else "charlm"
        if argv:
            report(f"error: {e.format_message()} (see `{where} -h`)")
        else:
            e.show()
        sys.exit(e.exit_code)
    except (CharlmError, OSError) as e:
        if "--debug" in argv:
            raise
        report(f"error: {error_message(e)}")
        sys.exit(2)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError (CUDA) is a RuntimeError
        command = next((a for a in argv if not a.startswith("-")), "train")
        line = None if "--debug" in argv else out_of_memory_line(e, command)
        if line is None:
            raise
        print(line, file=sys.stderr)  # every process's: under torchrun one GPU may run out alone
        sys.exit(2)
    except Interrupt as e:
        print(e.line(), file=sys.stderr)
        sys.exit(e.exit_code)
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)
    sys.exit(code or 0)  # as typer's own main ends; code: typer.Exit's (130, 143 if interrupted)
