"""`prepare` over many and unusual inputs: compressed files, files to skip, a split by whole
files, a Unicode normal form, stdin, and the splits and disks it refuses."""

import bz2
import errno
import gzip
import hashlib
import io
import lzma
import os
import sys
import unicodedata

import numpy as np
import pytest

from charlm.core.errors import CharlmError
from charlm.data import chunks
from charlm.data.corpus import TextOptions, held_out
from charlm.data.dataset import load_dataset
from charlm.data.text import prepare

TEXT = "the quick brown fox jumps over the lazy dog, naïve café\n" * 40


def ids_of(out):
    ds = load_dataset(out)
    return ds.vocab.decode(ds.train), ds.vocab.decode(ds.val)


@pytest.mark.parametrize("suffix, compress", [(".gz", gzip.compress), (".bz2", bz2.compress),
                                              (".xz", lzma.compress)])
def test_a_compressed_file_prepares_as_its_text_and_is_keyed_by_its_bytes(tmp_path, suffix,
                                                                         compress, monkeypatch):
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 100)  # many chunks out of the decompressor
    plain, packed = tmp_path / "t.txt", tmp_path / f"t.txt{suffix}"
    plain.write_text(TEXT, encoding="utf-8")
    packed.write_bytes(compress(TEXT.encode()))
    prepare([plain], tmp_path / "plain", progress=False)
    meta = prepare([packed], tmp_path / "packed", progress=False)
    assert ids_of(tmp_path / "packed") == ids_of(tmp_path / "plain")
    assert [(s["bytes"], s["sha256"], s["chars"]) for s in meta["sources"]] == [
        (packed.stat().st_size, hashlib.sha256(packed.read_bytes()).hexdigest(), len(TEXT))]


def test_a_cut_gzip_file_is_one_error_or_skipped(tmp_path):
    good, cut = tmp_path / "good.txt", tmp_path / "cut.txt.gz"
    good.write_text(TEXT, encoding="utf-8")
    cut.write_bytes(gzip.compress(TEXT.encode() * 50)[:200])
    with pytest.raises(CharlmError) as e:
        prepare([good, cut], tmp_path / "ds", progress=False)
    assert str(e.value) == (f"cannot decompress {cut} as .gz data: it ends before its "
                            "end-of-stream marker (cut short?); check the file (`gzip -t "
                            f"{cut}`), or "
                            "pass --skip-invalid (data.skip_invalid) to skip such files")
    assert not (tmp_path / "ds").exists()
    meta = prepare([good, cut], tmp_path / "ds", progress=False,
                   options=TextOptions(skip_invalid=True))
    assert [(s["path"], s["reason"]) for s in meta["skipped"]] == [(str(cut), "damaged")]


def test_skip_invalid_skips_and_counts_what_is_not_text_and_forgets_its_characters(
        tmp_path, monkeypatch):
    """Three empty __init__.py files, a binary, a Latin-1 file whose first chunks were read
    before its bad byte, and two good files: the good ones are the dataset; the bad file's
    characters read before the fault are not in the vocabulary."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 8)
    root = tmp_path / "src"
    for name in ("a/__init__.py", "b/__init__.py", "c/__init__.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")
    (root / "blob.bin").write_bytes(b"\x7fELF\x00\x01")
    (root / "latin.txt").write_bytes(b"QQQQQQQQ ZZZZZZZZ caf\xe9")
    (root / "m.py").write_text("print('hello')\n" * 20)
    (root / "n.py").write_text("x = 1\n" * 20)
    meta = prepare([root], tmp_path / "ds", progress=False, options=TextOptions(skip_invalid=True))
    assert [s["path"] for s in meta["sources"]] == [str(root / "m.py"), str(root / "n.py")]
    skipped = meta["skipped"]
    assert sorted((s["path"].removeprefix(f"{root}/"), s["reason"]) for s in skipped) == [
        ("a/__init__.py", "empty"), ("b/__init__.py", "empty"), ("blob.bin", "binary"),
        ("c/__init__.py", "empty"), ("latin.txt", "not UTF-8")]
    assert "Q" not in meta["vocab"] and "Z" not in meta["vocab"]
    train, val = ids_of(tmp_path / "ds")
    assert train + val == "".join(  # each source's tail is val: compare the whole
        t[:int(len(t) * 0.9)] for t in ("print('hello')\n" * 20, "x = 1\n" * 20)) + "".join(
        t[int(len(t) * 0.9):] for t in ("print('hello')\n" * 20, "x = 1\n" * 20))
    with pytest.raises(CharlmError, match="is not valid UTF-8 text"):
        prepare([root / "latin.txt"], tmp_path / "ds2", progress=False)
    with pytest.raises(CharlmError) as e:
        prepare([root / "a"], tmp_path / "ds3", progress=False,
                options=TextOptions(skip_invalid=True))
    assert str(e.value) == ("no text to learn from: all 1 inputs were skipped (1 empty); give "
                            "UTF-8 text files")


def test_split_files_holds_out_whole_files_chosen_by_their_path(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    texts = {f"f{i:02d}.txt": f"file {i} says {'abc' * i}\n" * 5 for i in range(20)}
    for name, text in texts.items():
        (root / name).write_text(text)
    meta = prepare([root], tmp_path / "ds", 0.25, progress=False,
                   options=TextOptions(split="files"))
    val = [name for name in texts if held_out(name, 0.25)]
    assert 0 < len(val) < len(texts)
    assert {s["path"].rsplit("/", 1)[1]: s["split"] for s in meta["sources"]} == {
        name: "val" if name in val else "train" for name in texts}
    assert ids_of(tmp_path / "ds") == ("".join(t for n, t in texts.items() if n not in val),
                                       "".join(texts[n] for n in val))
    moved = tmp_path / "elsewhere"
    root.rename(moved)  # the hash is of the path under the folder: the split stays
    again = prepare([moved], tmp_path / "ds2", 0.25, progress=False,
                    options=TextOptions(split="files"))
    assert [s["split"] for s in again["sources"]] == [s["split"] for s in meta["sources"]]


def test_a_normal_form_is_applied_across_chunk_cuts(tmp_path, monkeypatch):
    """NFD text (e + U+0301) cut between its letter and its accent in every chunk size: with
    NFC each é is one character, as a model that knows é needs."""
    text = unicodedata.normalize("NFD", "café crème résumé, déjà vu\n" * 30)
    src = tmp_path / "nfd.txt"
    src.write_text(text, encoding="utf-8")
    for size in (3, 4, 5, 7):
        monkeypatch.setattr(chunks, "CHUNK_BYTES", size)
        out = tmp_path / f"ds{size}"
        meta = prepare([src], out, progress=False, options=TextOptions(normalize="NFC"))
        assert "\u0301" not in meta["vocab"] and "é" in meta["vocab"]
        assert "".join(ids_of(out)) == unicodedata.normalize("NFC", text)
        assert meta["unicode_normalize"] == "NFC"


def test_stdin_is_an_input(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(TEXT.encode())))
    meta = prepare(["-"], tmp_path / "ds", progress=False)
    assert [s["path"] for s in meta["sources"]] == ["<stdin>"]
    assert "".join(ids_of(tmp_path / "ds")) == TEXT


def test_a_split_that_leaves_no_train_or_val_text_is_refused(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("hello world\n" * 10)
    with pytest.raises(CharlmError) as e:
        prepare([src], tmp_path / "ds", 0.999999, progress=False)
    assert str(e.value) == ("--val-fraction 0.999999 leaves 0 characters for train of 120 "
                            "characters; choose a fraction that leaves both splits some text, "
                            "or give more text")
    assert not (tmp_path / "ds").exists()


def test_a_full_disk_names_the_dataset_and_keeps_what_was_there(tmp_path, monkeypatch):
    src = tmp_path / "t.txt"
    src.write_text(TEXT)
    old = tmp_path / "old"
    prepare([src], old, progress=False)
    before = {p.name: p.read_bytes() for p in old.iterdir()}

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    for out in (old, tmp_path / "new"):
        with pytest.raises(CharlmError) as e:
            prepare([src], out, progress=False)
        assert str(e.value) == (f"cannot write dataset {out}: No space left on device (it needs "
                                "about 0 MiB or more); nothing was kept of the new dataset and "
                                "what was there is as it was, free disk space or give another "
                                "--out")
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before
    assert not (tmp_path / "new").exists()


def test_train_counts_and_ids_stay_what_they_were_for_one_file(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text(TEXT)
    meta = prepare([src], tmp_path / "ds", progress=False)
    n_train = int(len(TEXT) * 0.9)
    assert (meta["train_tokens"], meta["val_tokens"]) == (n_train, len(TEXT) - n_train)
    assert meta["split"] == "tail" and meta["sources"][0]["split"] == "tail"
    assert np.array_equal(load_dataset(tmp_path / "ds").train[:3],
                          [meta["vocab"].index(c) for c in TEXT[:3]])


def test_split_files_far_from_the_val_fraction_is_warned_about(tmp_path, capsys):
    """Two files with data.split files put 25 % or 75 % of the text in val, silently."""
    root = tmp_path / "two"
    root.mkdir()
    (root / "a.txt").write_text("abc" * 100)
    (root / "b.txt").write_text("xyz" * 300)
    meta = prepare([root], tmp_path / "ds", 0.1, progress=False,
                   options=TextOptions(split="files"))
    held = [s for s in meta["sources"] if s["split"] == "val"]
    assert len(held) == 1
    share = meta["val_tokens"] / (meta["train_tokens"] + meta["val_tokens"])
    assert share in (0.25, 0.75)
    assert capsys.readouterr().err == (
        f"warning: data.split files holds out 1 of 2 files, {share:.0%} of the text, for "
        "validation, not the 10% of the val fraction: whole files go to one side; give more "
        "files, or use data.split tail\n")
    prepare([root], tmp_path / "tail", 0.1, progress=False)  # the tail split: no warning
    assert capsys.readouterr().err == ""
