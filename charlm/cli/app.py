"""The `charlm` command line: the root app, which imports a command's module only when the
command runs (or `--help` lists it), and `main`, which ends bad input with one `error:` line."""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Annotated

import typer
import typer.core
import typer.main

from charlm.cli import reporting
from charlm.core.errors import CharlmError, SettingError

COMMANDS = ("prepare", "train", "sample", "info", "eval", "export", "tune", "serve")


class LazyGroup(typer.core.TyperGroup):
    """The commands, each loaded from `charlm.cli.<name>` when it is asked for."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: typer.Context, name: str):
        if name not in COMMANDS:
            return None
        return typer.main.get_command(importlib.import_module(f"charlm.cli.{name}").app)


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


def main(argv: list[str] | None = None) -> None:
    """Run the app: bad input ends with one `error:` line and exit code 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    reporting.tolerant_stdout()
    # Typer turns KeyboardInterrupt into a silent exit 130, and SIGTERM's default ends the
    # process where it stands (leaving its temporary files): both raise Interrupt instead. A
    # signal set to be ignored (a shell's background job) or handled by the caller stays so.
    defaults = (signal.default_int_handler, signal.SIG_DFL)
    replaced = {sig: handler for sig in reporting.STOP_SIGNALS
                if (handler := signal.getsignal(sig)) in defaults}
    for sig in replaced:
        signal.signal(sig, reporting.raise_interrupt)
    try:
        code = app(args=argv, prog_name="charlm", standalone_mode=False)
    except typer.TyperException as e:  # a usage error (an unknown option); `charlm` alone: help
        where = e.ctx.command_path if getattr(e, "ctx", None) else "charlm"
        if argv:
            reporting.report(f"error: {e.format_message()} (see `{where} -h`)")
        else:
            e.show()
        sys.exit(e.exit_code)
    except (CharlmError, OSError) as e:
        if "--debug" in argv:
            raise
        reporting.report(f"error: {error_message(e)}")
        sys.exit(2)
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError (CUDA) is a RuntimeError
        if "--debug" in argv or not reporting.out_of_memory(e):
            raise
        # every process prints it: under torchrun one GPU may run out alone
        command = next((a for a in argv if not a.startswith("-")), "train")
        print(reporting.out_of_memory_line(e, command), file=sys.stderr)
        sys.exit(2)
    except reporting.Interrupt as e:
        print(e.line(), file=sys.stderr)
        sys.exit(e.exit_code)
    finally:
        for sig, handler in replaced.items():
            signal.signal(sig, handler)
    sys.exit(code or 0)  # as typer's own main ends; code: typer.Exit's (130, 143 if interrupted)
