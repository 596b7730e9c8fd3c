"""`charlm prepare` as a process: it prepares text without importing torch."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT


@pytest.mark.parametrize("name, text, option, wrote", [
    ("t.txt", "hello world, hello world\n", [], "10 symbols (uint8), 22 train / 3 val characters "
     "from 1 file"),
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


# `charlm ARGS`, whose prepare stays inside its write (its .bin temporaries open) for a minute
SLOW_PREPARE = ("import sys, time\n"
                "import charlm.data.prepare as text\n"
                "encode = text.encode_source\n"
                "def slow(*args):\n    encode(*args)\n    time.sleep(60)\n"
                "text.encode_source = slow\n"
                "from charlm.cli.app import main\n"
                "main(sys.argv[1:])\n")


@pytest.mark.parametrize("command", ["prepare", "train"])
def test_sigterm_while_preparing_removes_its_temporaries_and_exits_143(tmp_path, corpus, command):
    """SIGTERM during `charlm prepare` or the prepare step of `charlm train TEXT` killed the
    process without a word (exit -15) and left .train.bin.tmp-PID and .val.bin.tmp-PID (668-782
    MB for a large text) that nothing removed. Now: one line, exit 143 as training's, and
    everything as it was: the dataset it was replacing byte for byte, no run dir made."""
    from charlm.data.prepare import prepare

    old = tmp_path / "old.txt"
    old.write_text("hello world, hello world\n", encoding="utf-8")
    prepare([old], tmp_path / "ds", progress=False)
    out = tmp_path / ("ds" if command == "prepare" else "run")

    def everything() -> dict[str, bytes | None]:
        return {str(p.relative_to(tmp_path)): p.read_bytes() if p.is_file() else None
                for p in tmp_path.rglob("*")}

    before = everything()
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_PREPARE, command, str(corpus), "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.rglob(".*.tmp-*")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no temporary file appeared"
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert (proc.returncode, err) == (143, "interrupted by SIGTERM\n")
    assert everything() == before


AS_LIMIT = 440 << 20  # address space: prepare's interpreter, numpy and threads take ~370 MB


def test_prepare_streams_a_corpus_larger_than_its_address_space(tmp_path):
    """Memory stays bounded by a constant whatever the corpus: a 480 MB text (non-ASCII, so every
    chunk is decoded) prepares in a process that cannot map even 440 MB."""
    import resource

    src = tmp_path / "big.txt"
    line = ("naïve café " * 30 + "plain ascii words here " * 10 + "\n").encode()
    with open(src, "wb") as f:
        for _ in range((480 << 20) // len(line)):
            f.write(line)
    limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))  # noqa: E731
    result = subprocess.run(
        [sys.executable, "-m", "charlm", "prepare", str(src), "--out", str(tmp_path / "ds")],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=120, preexec_fn=limit)
    assert result.returncode == 0, result.stderr
    chars = len(line.decode()) * ((480 << 20) // len(line))
    assert ((tmp_path / "ds" / "train.bin").stat().st_size
            + (tmp_path / "ds" / "val.bin").stat().st_size) == chars
