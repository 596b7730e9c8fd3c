"""`charlm prepare` as a process: it prepares text without importing torch."""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.parametrize("name, text, option, wrote", [
    ("t.txt", "hello world, hello world\n", [], "10 symbols (uint8), 22 train / 3 val characters"),
    ("p.tsv", "".join(f"{w}\t{w.upper()}\n" for w in ("cat", "dog", "hat", "bat", "rat")),
     ["--pairs"], "4 train / 1 val / 0 test pairs"),
])
def test_prepare_imports_no_torch(tmp_path, name, text, option, wrote):
    """`charlm prepare` spent 2.4 s of its time importing torch, which it never uses (with
    --pairs too, until the pairs' batches moved out of charlm.pairs)."""
    src = tmp_path / name
    src.write_text(text, encoding="utf-8")
    code = ("import sys; from charlm.cli.app import main\n"
            "try:\n    main(sys.argv[1:])\n"
            "finally:\n    print('torch' in sys.modules)")
    result = subprocess.run(
        [sys.executable, "-c", code, "prepare", *option, str(src), "--out", str(tmp_path / "ds")],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"wrote {tmp_path / 'ds'}: {wrote}", "False"]
