"""The `charlm` command as a process: `python -m charlm`, and what a command has imported when it
fails or ends (no torch for a bad config, no torch._dynamo where nothing compiles)."""

import subprocess
import sys

from tests.helpers import COMMANDS, ROOT


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
