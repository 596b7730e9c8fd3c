"""`charlm prepare`: the dataset it writes and the inputs it refuses."""

from __future__ import annotations

import os

from tests.helpers import SHAKESPEARE, TINY


def test_prepare_command(cli, tmp_path):
    out = tmp_path / "ds"
    result = cli("prepare", SHAKESPEARE, "--out", out)
    assert result.code == 0
    assert result.out.strip() == (
        f"wrote {out}: 65 symbols (uint8), 1,003,854 train / 111,540 val characters from 1 file")
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_directory_where_a_text_file_is_expected(fails, tmp_path):
    (tmp_path / "texts").mkdir()
    fails("prepare", tmp_path / "texts", "--out", tmp_path / "ds",
          message=f"{tmp_path / 'texts'} holds no files; give a folder or pattern with text "
                  "files in it")


def test_a_pipe_is_refused_as_an_input_to_prepare(fails, tmp_path):
    """`charlm prepare <(cmd)` read the pipe's text in pass 1 and nothing in pass 2: exit 0 with
    empty train.bin/val.bin under a meta.json that counted the characters (and a named pipe
    blocked); `charlm train --data <(cmd)` said the input was empty."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"hello world, hello world")
    os.close(write_end)
    pipe = f"/proc/self/fd/{read_end}"
    message = (f"input is not a regular file (a pipe or a device): {pipe}; charlm reads its "
               "text twice: give it as - (stdin), or save it to a file first")
    try:
        fails("prepare", pipe, "--out", tmp_path / "ds", message=message)
        fails("train", TINY, "--data", pipe, "--out", tmp_path / "run", message=message)
    finally:
        os.close(read_end)
    fails("prepare", "/dev/null", "--out", tmp_path / "ds",
          message=message.replace(pipe, "/dev/null"))


def _held(path):
    """An exclusive flock on the directory `path`, as another charlm process would hold it."""
    import fcntl

    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_prepare_into_a_dataset_dir_another_prepare_writes_is_refused(fails, cli, tmp_path):
    """Two prepares into one --out, both exit 0, left one input's meta.json beside the other's
    .bin files (2 of 6 tries); the second now waits for nothing and mixes nothing."""
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello world\n", encoding="utf-8")
    out = tmp_path / "ds"
    assert cli("prepare", text, "--out", out).code == 0
    fd = _held(out)
    try:
        for pairs in ([], ["--pairs"]):
            fails("prepare", *pairs, text, "--out", out, message=(
                f"dataset dir {out} is in use by another `charlm prepare` (or a `charlm train` "
                "preparing its data); wait for it to end, or choose another --out"))
    finally:
        os.close(fd)


def test_a_prepare_into_a_run_that_trains_is_refused(fails, tmp_path):
    """`charlm prepare --out RUN/dataset` rewrote the dataset a running `charlm train` of RUN
    reads (its run lock: a flock on RUN); it is refused, and nothing is made in RUN."""
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello world\n", encoding="utf-8")
    run = tmp_path / "run"
    fd = _held(run)
    try:
        for out in (run / "dataset", run / "sub" / "ds"):
            fails("prepare", text, "--out", out, message=(
                f"--out {out} is inside {run}, which a running `charlm train` holds; wait for "
                "it to end, or choose another --out"))
    finally:
        os.close(fd)
    assert list(run.iterdir()) == []


def test_prepare_benchmark_writes_the_split_and_refuses_a_wrong_file(cli, fails, tmp_path,
                                                                     monkeypatch):
    """`charlm prepare --benchmark enwik8 FILE`, on a generated file that the size and sha256
    check is pointed at (the real one is 100 MB); a wrong file, a second input, a split or
    units of one's own, and an unknown benchmark are each one error."""
    import hashlib

    from charlm.data import datasets

    data = "<page>Ελλάδα 東京 🙂 [[link]] ok</page>\n".encode() * 50  # 2,500 bytes
    src, out = tmp_path / "enwik8", tmp_path / "ds"
    src.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    monkeypatch.setitem(datasets.BENCHMARKS, "enwik8", datasets.Benchmark(
        len(data), digest, "byte", (2250, 125, 125), "http://mattmahoney.net/dc/enwik8.zip"))
    result = cli("prepare", "--benchmark", "enwik8", src, "--out", out)
    assert (result.code, result.err) == (0, "")
    assert result.out == (f"wrote {out}: {len(set(data))} symbols (uint8), 2,250 train / 125 "
                          "val / 125 test bytes\n")
    assert sorted(p.name for p in out.iterdir()) == [
        "meta.json", "test.bin", "train.bin", "val.bin"]
    (tmp_path / "other").write_bytes(data[:-1])
    fails("prepare", "--benchmark", "enwik8", tmp_path / "other", "--out", out,
          message=f"{tmp_path / 'other'} is not enwik8: expected 2,500 bytes with sha256 "
                  f"{digest}, found 2,499 bytes; give the file unzipped from "
                  "http://mattmahoney.net/dc/enwik8.zip")
    fails("prepare", "--benchmark", "enwik8", src, src, "--out", out,
          message="--benchmark enwik8 takes one file, the benchmark's, got 2")
    fails("prepare", "--benchmark", "enwik8", src, "--units", "byte", "--out", out,
          message="--benchmark fixes the split and the units; leave out --val-fraction, "
                  "--units, --pairs, --set and the other text options")
    fails("prepare", "--benchmark", "enwik9", src, "--out", out,
          message="--benchmark must be one of enwik8, text8, got 'enwik9'")



def test_prepare_benchmark_reads_stdin_as_its_file(cli, fails, tmp_path, monkeypatch):
    """`unzip -p enwik8.zip | charlm prepare --benchmark enwik8 -` was "input file not found:
    -": the file is read twice (checked, then split), so stdin is copied first, and removed."""
    import hashlib
    import io
    import sys
    import tempfile

    from charlm.data import datasets

    data = "<page>Ελλάδα 東京 🙂 [[link]] ok</page>\n".encode() * 50  # 2,500 bytes
    monkeypatch.setitem(datasets.BENCHMARKS, "enwik8", datasets.Benchmark(
        len(data), hashlib.sha256(data).hexdigest(), "byte", (2250, 125, 125),
        "http://mattmahoney.net/dc/enwik8.zip"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    result = cli("prepare", "--benchmark", "enwik8", "-", "--out", tmp_path / "ds")
    assert (result.code, result.err) == (0, "")
    assert (tmp_path / "ds" / "test.bin").stat().st_size == 125
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data + b"more")))
    fails("prepare", "--benchmark", "enwik8", "-", "--out", tmp_path / "ds2",
          message="- is not enwik8: expected 2,500 bytes with sha256 "
                  f"{hashlib.sha256(data).hexdigest()}, found 2,501 bytes; give the file "
                  "unzipped from http://mattmahoney.net/dc/enwik8.zip")
    assert list((tmp_path / "tmp").iterdir()) == []


def test_prepare_a_folder_skipping_what_is_not_text_says_what_it_skipped(cli, tmp_path):
    root = tmp_path / "src"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_bytes(b"")
    (root / "pkg" / "m.py").write_text("print('hello world')\n" * 10)
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (root / "notes.md").write_text("# notes\n" * 10)
    out = tmp_path / "ds"
    result = cli("prepare", root, "--out", out, "--skip-invalid", "--exclude", "*.md")
    assert (result.code, result.err) == (0, "")
    assert result.out == (f"wrote {out}: 16 symbols (uint8), 189 train / 21 val characters "
                          "from 1 file; skipped 2 (1 empty, 1 not UTF-8)\n")
    failed = cli("prepare", root, "--out", tmp_path / "ds2")
    assert (failed.code, failed.err) == (
        2, f"error: {root / 'logo.png'} is not valid UTF-8 text (invalid byte 0x89 at byte "
           "offset 0); charlm reads text files as UTF-8, convert it first, or pass "
           "--skip-invalid (data.skip_invalid) to skip such files\n")
