"""The `charlm` command as a process: `python -m charlm`, and what a command has imported when it
fails or ends: no torch for help or a bad config, no command module but the one that runs, no
torch._dynamo where nothing compiles; and the Python API, which never imports the CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from charlm.cli.app import COMMANDS as APP_COMMANDS
from tests.helpers import COMMANDS, ROOT

# `charlm ARGS` in a child process; the last line of its stderr lists the charlm, typer and
# torch modules it has imported, as JSON.
MAIN_THEN_MODULES = (
    "import json, sys\n"
    "from charlm.cli.app import main\n"
    "try:\n    main(sys.argv[1:])\n"
    "finally:\n"
    "    print(json.dumps(sorted(m for m in sys.modules\n"
    "                            if m.partition('.')[0] in ('charlm', 'typer', 'torch'))),\n"
    "          file=sys.stderr)\n")


def modules_after(*args: str, cwd: Path) -> tuple[int, str, set[str]]:
    """The exit code, stdout and imported modules of `charlm ARGS`, run in a child process."""
    result = subprocess.run([sys.executable, "-c", MAIN_THEN_MODULES, *args], cwd=cwd,
                            capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout, set(json.loads(result.stderr.splitlines()[-1]))


def command_modules(modules: set[str]) -> set[str]:
    """The modules of charlm.cli that hold a command."""
    return {m for m in modules if m.startswith("charlm.cli.")
            and m.removeprefix("charlm.cli.") in APP_COMMANDS}


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


def test_help_and_a_bad_train_config_leave_torch_unimported(tmp_path):
    """`charlm --help` loads every command's module to list it; neither it nor a mistyped key
    given to `charlm train` imports torch (2 s on the EPYC)."""
    code, out, modules = modules_after("--help", cwd=tmp_path)
    assert code == 0 and all(f"  {command} " in out for command in APP_COMMANDS)
    assert command_modules(modules) == {f"charlm.cli.{c}" for c in APP_COMMANDS}
    assert "typer" in modules and "torch" not in modules
    code, out, modules = modules_after("train", "--set", "model.n_layr=2", cwd=tmp_path)
    assert (code, out) == (2, "") and "torch" not in modules


@pytest.mark.parametrize("command", APP_COMMANDS)
def test_a_commands_help_imports_that_command_alone(tmp_path, command):
    """`charlm train --help` needs charlm.cli.train, not the modules of sample, tune, ..."""
    code, out, modules = modules_after(command, "--help", cwd=tmp_path)
    assert code == 0 and out.startswith(f"Usage: charlm {command} ")
    assert command_modules(modules) == {f"charlm.cli.{command}"}
    assert "torch" not in modules


def test_the_python_api_never_imports_the_cli(tiny_run):
    """`import charlm`, `charlm.load` and `charlm.generate` run without typer (or click): the
    API is usable where only torch is installed, and pays nothing for the command line."""
    code = ("import sys\n"
            "import charlm\n"
            "model = charlm.load(sys.argv[1])\n"
            "print(len(charlm.generate(model, 'ROMEO:', max_new_tokens=5, seed=1)))\n"
            "print(sorted(m for m in sys.modules if m.partition('.')[0] in ('typer', 'click')\n"
            "             or m.startswith('charlm.cli')))\n")
    result = subprocess.run([sys.executable, "-c", code, tiny_run], capture_output=True,
                            text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, "5\n[]\n"), result.stderr
