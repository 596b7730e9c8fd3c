"""Shared fixtures: the tiny config (2 layers, 32 dims, block 16), a small corpus, temp run dirs
and an in-process CLI runner."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from charlm.cli import main
from charlm.config import MODEL_VARIANTS, RunConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT / "data" / "tinyshakespeare.txt"

# Each single-option change of the architecture from the default, and one with every option
# changed at once. Keys are `model` config keys.
VARIANTS = {
    **MODEL_VARIANTS,
    "all_changed": {"pos_encoding": "rope", "norm": "rmsnorm", "norm_placement": "post",
                    "activation": "swiglu", "tie_weights": False, "bias": True},
}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """The first 40,000 characters of tiny-shakespeare (all 65 symbols are not needed)."""
    path = tmp_path / "corpus.txt"
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    return path


@pytest.fixture
def tiny_cfg(tmp_path: Path, corpus: Path) -> RunConfig:
    """configs/tiny.yaml training on `corpus` into a temp run dir."""
    return load_config(ROOT / "configs" / "tiny.yaml", [
        f"train.out_dir={tmp_path / 'run'}", f"data.path={corpus}",
    ])


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    """Run `charlm ARGS...` in-process; returns exit code, stdout and stderr."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["charlm", *map(str, args)])
        code = 0
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
