"""`charlm eval` on an export of random weights: the errors of what it reads."""

from __future__ import annotations

from tests.helpers import random_export


def test_eval_of_a_device_is_one_error(fails, tmp_path):
    """`charlm eval RUN /dev/zero` read the device until a MemoryError."""
    st = random_export(tmp_path / "st", "abc")
    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    fails("eval", st, zero, message=f"cannot read text file {zero}: not a regular file (a "
                                    "directory, FIFO or device); give a regular file")


def test_eval_reads_the_text_on_stdin_and_counts_unknown_characters(cli, monkeypatch, tmp_path):
    """`-` was "input file not found: -"; the text is read from stdin in the same stream, and
    characters outside the vocabulary are counted in the message (the first ten listed)."""
    import io
    import sys

    st = random_export(tmp_path / "st", "abc")
    text = tmp_path / "t.txt"
    text.write_text("abcab" * 30, encoding="utf-8")
    from_file = cli("eval", st, text)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"abcab" * 30)))
    from_stdin = cli("eval", st, "-")
    assert (from_stdin.code, from_stdin.out, from_stdin.err) == (0, from_file.out, "")
    assert from_file.out.endswith(", 149 characters scored\n")
    text.write_text("axbc" + "z" * 11 + "abc", encoding="utf-8")
    result = cli("eval", st, text)
    listed = ", ".join(["'x' at 1"] + [f"'z' at {i}" for i in range(4, 13)])
    assert (result.code, result.out, result.err) == (2, "", (
        f"error: the text has 12 characters outside the model's vocabulary ({listed} and 2 "
        "more); pass --unknown skip to drop them\n"))
    skipped = cli("eval", st, text, "--unknown", "skip")
    assert skipped.code == 0 and skipped.err == (
        "warning: skipped 12 characters outside the vocabulary\n")
    assert skipped.out.endswith(", 5 characters scored\n")


def split_export(tmp_path, units: str = "char"):
    """A random GPT whose data.path is a dataset dir with a test split of 40 ids written
    here (train 36, val 4 of the 40 characters prepared)."""
    import json

    from charlm.config.data import DataConfig, TextOptions
    from charlm.config.schema import RunConfig
    from charlm.data.dataset_dir import load_dataset
    from charlm.data.prepare import prepare
    from charlm.export import save_safetensors
    from charlm.model.gpt import GPT
    from tests.helpers import tiny_model_config

    text = tmp_path / "t.txt"
    text.write_text("abcdefghij" * 4, encoding="utf-8")
    data = tmp_path / "data"
    prepare([text], data, 0.1, progress=False, options=TextOptions(units=units))
    (data / "test.bin").write_bytes(bytes(i % 10 for i in range(40)))
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "test_tokens": 40}))
    cfg = RunConfig(model=tiny_model_config(), data=DataConfig(path=str(data)))
    vocab = load_dataset(data).vocab
    save_safetensors(GPT(cfg.model, len(vocab)), vocab, cfg, tmp_path / "st")
    return tmp_path / "st", data


def test_eval_split_scores_the_runs_held_out_split(cli, tmp_path):
    """`charlm eval RUN --split val|test` scores the run's own split: every id after the
    first once, in the windows `charlm eval` gives a text file."""
    import json

    st, data = split_export(tmp_path)
    test = cli("eval", st, "--split", "test", "--json")
    assert test.code == 0, test.err
    result = json.loads(test.out)
    assert (result["chars_scored"], result["split"], result["units"]) == (39, "test", "char")
    as_text = tmp_path / "test.txt"
    as_text.write_text("abcdefghij" * 4, encoding="utf-8")
    assert json.loads(cli("eval", st, as_text, "--json").out)["loss"] == result["loss"]
    val = cli("eval", st, "--split", "val")
    assert val.code == 0 and val.out.startswith("val split: loss ")
    assert val.out.endswith(", 3 characters scored\n")


def test_eval_split_of_a_byte_dataset_gives_bits_per_byte(cli, tmp_path):
    st, _ = split_export(tmp_path, "byte")
    result = cli("eval", st, "--split", "test")
    assert result.code == 0, result.err
    assert " bits/byte, " in result.out and result.out.endswith(", 39 bytes scored\n")


def test_eval_split_errors(fails, tmp_path):
    st, data = split_export(tmp_path)
    (data / "test.bin").unlink()
    meta = (data / "meta.json").read_text().replace(', "test_tokens": 40', "")
    (data / "meta.json").write_text(meta)
    fails("eval", st, "--split", "test", message=(
        f"--split test: dataset {data} has no test split (only a benchmark prepared with "
        "`charlm prepare --benchmark` has one); use --split val"))
    fails("eval", st, message="give charlm eval a TEXT_FILE to score, or --split val|test for "
                              "the run's held-out split (not both)")
    fails("eval", st, "--split", "train", message="--split must be val or test, got 'train'")
    other = random_export(tmp_path / "other", "abc")
    fails("eval", other, "--split", "val", message=(
        f"--split val: {other} has no prepared dataset (neither {other / 'dataset'} nor "
        "data.path data/tinyshakespeare.txt is one); give the held-out text as TEXT_FILE "
        "instead"))


def test_a_file_is_checked_whole_before_anything_is_scored(cli, monkeypatch, tmp_path):
    """Streamed, a text file's last character could end the pass after every window before it
    was scored (minutes for a large file): a file is read once to check it first, as when it
    was read whole."""
    st = random_export(tmp_path / "st", "abc")

    def never(*args, **kwargs):
        raise AssertionError("scored before the text was checked")

    monkeypatch.setattr("charlm.evaluation.scoring.score_windows", never)
    text = tmp_path / "t.txt"
    text.write_text("abc" * 1000 + "x", encoding="utf-8")
    assert cli("eval", st, text).err == (
        "error: the text has 1 character outside the model's vocabulary ('x' at 3000); pass "
        "--unknown skip to drop them\n")
    text.write_bytes(b"abc" * 1000 + b"\xff")
    assert cli("eval", st, text, "--unknown", "skip").err == (
        f"error: {text} is not valid UTF-8 text (invalid byte 0xff at byte offset 3000); charlm "
        "reads text files as UTF-8, convert it first\n")
