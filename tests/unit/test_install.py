"""What charlm asks of torch: a release without `weights_only` bypasses, required by
pyproject.toml, installed by scripts/install.sh, and said in the README's set-up."""

import re

import torch

from tests.helpers import ROOT

# torch.load(weights_only=True) could run code up to 2.5.1 (CVE-2025-32434) and up to 2.9.1
# (CVE-2026-24747); charlm loads users' .pt files with it.
SAFE = (2, 10)


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.match(r"\d+(\.\d+)*", version)[0].split("."))


def test_torch_is_required_past_its_weights_only_bypasses():
    [floor] = re.findall(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert release(floor) >= SAFE
    install = (ROOT / "scripts" / "install.sh").read_text()
    specs = re.findall(r'"?torch(?:>=|==)[^\s"]+"?|whl/cpu torch\b', install)
    assert specs and all(f">={floor}" in s for s in specs if "==" not in s), specs
    pinned = re.search(r"CHARLM_TORCH_VERSION:-([\d.]+)", install)[1]
    assert release(pinned) >= SAFE  # the CPU build a machine without CUDA gets
    assert f"torch >= {floor}" in (ROOT / "README.md").read_text().split("## Quick start")[0]
    assert release(torch.__version__) >= SAFE
