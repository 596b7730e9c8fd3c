"""charlm.data.prepare: `prepare` writes meta.json, train.bin and val.bin as nanoGPT's prepare does,
whatever its chunking, and refuses what it cannot read.

`prepare` over many and unusual inputs: compressed files, files to skip, a split by whole
files, a Unicode normal form, stdin, and the splits and disks it refuses."""



import bz2
import errno
import gzip
import hashlib
import io
import json
import lzma
import os
import sys
import unicodedata

import numpy as np
import pytest

from charlm.config.data import TextOptions
from charlm.core.errors import CharlmError
from charlm.data import chunks
from charlm.data import prepare as data_module
from charlm.data.dataset_dir import load_dataset
from charlm.data.prepare import prepare
from tests.helpers import SHAKESPEARE


def test_tinyshakespeare_matches_nanogpt(tmp_path):
    meta = prepare([SHAKESPEARE], tmp_path / "ds", 0.1, progress=False)
    assert meta["vocab_size"] == 65
    assert (meta["train_tokens"], meta["val_tokens"]) == (1_003_854, 111_540)
    assert meta["dtype"] == "uint8"
    ds = load_dataset(tmp_path / "ds")
    text = SHAKESPEARE.read_text(encoding="utf-8")
    assert ds.vocab.chars == sorted(set(text))
    assert ds.vocab.decode(ds.train[:200]) == text[:200]
    assert ds.vocab.decode(ds.val[-200:]) == text[-200:]
    assert ds.vocab.decode(ds.val[:50]) == text[1_003_854:1_003_904]
    saved = json.loads((tmp_path / "ds" / "meta.json").read_text(encoding="utf-8"))
    assert saved["vocab"] == ds.vocab.chars  # a JSON list of strings
    assert saved["sources"][0]["bytes"] == SHAKESPEARE.stat().st_size
    assert len(saved["sources"][0]["sha256"]) == 64


def test_split_is_last_fraction_of_each_input(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("abcdefghij")  # 10 chars: 8 train, 2 val at 0.2
    b.write_text("KLMNO")  # 5 chars: 4 train, 1 val
    meta = prepare([a, b], tmp_path / "ds", 0.2, progress=False)
    ds = load_dataset(tmp_path / "ds")
    assert ds.vocab.decode(ds.train) == "abcdefghKLMN"
    assert ds.vocab.decode(ds.val) == "ijO"
    assert (meta["train_tokens"], meta["val_tokens"]) == (12, 3)


def test_chunked_encoding_equals_whole_file(tmp_path, monkeypatch):
    text = "añb€c𝄞" * 50 + "\n"
    src = tmp_path / "u.txt"
    src.write_text(text, encoding="utf-8")
    prepare([src], tmp_path / "whole", 0.1, progress=False)
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 7)  # split multi-byte characters
    prepare([src], tmp_path / "chunked", 0.1, progress=False)
    for split in ("train.bin", "val.bin"):
        whole, chunked = (tmp_path / d / split for d in ("whole", "chunked"))
        assert whole.read_bytes() == chunked.read_bytes()
    ds = load_dataset(tmp_path / "chunked")
    assert ds.vocab.decode(np.concatenate([ds.train, ds.val])) == text


def test_uint16_ids_for_large_vocab(tmp_path):
    src = tmp_path / "cjk.txt"
    src.write_text("".join(chr(0x4E00 + i) for i in range(300)) * 3, encoding="utf-8")
    meta = prepare([src], tmp_path / "ds", 0.1, progress=False)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 300
    ds = load_dataset(tmp_path / "ds")
    assert ds.train.dtype == np.uint16
    assert ds.vocab.decode(ds.train[:300]) == src.read_text(encoding="utf-8")[:300]


@pytest.mark.parametrize("chunk", [1 << 20, 5])
def test_invalid_utf8_names_file_and_offset(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk)
    src = tmp_path / "bad.txt"
    src.write_bytes("héllo wor".encode() + b"\xff" + b"ld")
    out = tmp_path / "ds"
    with pytest.raises(CharlmError) as e:
        prepare([src], out, progress=False)
    assert str(e.value) == (
        f"{src} is not valid UTF-8 text (invalid byte 0xff at byte offset 10); "
        "charlm reads text files as UTF-8, convert it first, or pass --skip-invalid "
        "(data.skip_invalid) to skip such files")
    assert not out.exists()


@pytest.mark.parametrize("chunk", [1 << 20, 5])
def test_a_byte_order_mark_is_not_text(tmp_path, monkeypatch, chunk):
    """Files saved with a UTF-8 BOM (Windows editors) train on their text only, each of several
    inputs too; an invalid byte after a BOM is still named at its offset in the file."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk)
    bom = b"\xef\xbb\xbf"
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(bom + b"abab\r\nba" * 20)
    b.write_bytes(bom + b"cab" * 20)
    prepare([a, b], tmp_path / "ds", progress=False)
    ds = load_dataset(tmp_path / "ds")
    assert ds.vocab.chars == ["\n", "\r", "a", "b", "c"]  # CRLF line ends are kept as they are
    text = ds.vocab.decode(np.concatenate([ds.train, ds.val]))
    assert "\ufeff" not in text and len(text) == 20 * 8 + 20 * 3
    bad = tmp_path / "bad.txt"
    bad.write_bytes(bom + b"hello" + b"\xff")
    with pytest.raises(CharlmError, match="invalid byte 0xff at byte offset 8"):
        prepare([bad], tmp_path / "ds2", progress=False)


def reference_dataset(paths, val_fraction):
    """meta.json, train.bin and val.bin as `prepare` wrote them before its fast paths, spelled out
    in plain Python: each whole text decoded (a leading BOM dropped), the sorted set of all their
    characters, one id per character, nanoGPT's split of each source."""
    raws = [p.read_bytes() for p in paths]
    texts = [raw.decode("utf-8-sig") for raw in raws]
    chars = sorted(set("".join(texts)))
    index = {c: i for i, c in enumerate(chars)}
    dtype = np.dtype(np.uint8 if len(chars) <= 256 else np.uint16)
    train, val = bytearray(), bytearray()
    for text in texts:
        ids = np.array([index[c] for c in text], dtype=dtype)
        n_train = int(len(text) * (1 - val_fraction))
        train += ids[:n_train].tobytes()
        val += ids[n_train:].tobytes()
    meta = {
        "format": "charlm-dataset", "version": 1, "vocab": chars, "vocab_size": len(chars),
        "dtype": dtype.name, "val_fraction": val_fraction, "units": "char", "split": "tail",
        "skip_invalid": False, "include": [], "exclude": [], "unicode_normalize": None,
        "train_tokens": len(train) // dtype.itemsize, "val_tokens": len(val) // dtype.itemsize,
        "sources": [{"path": str(p), "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(),
                     "chars": len(text), "split": "tail"}
                    for p, raw, text in zip(paths, raws, texts, strict=True)],
        "skipped": [],
    }
    return {"meta.json": json.dumps(meta, ensure_ascii=False, indent=1).encode(),
            "train.bin": bytes(train), "val.bin": bytes(val)}


BOM = b"\xef\xbb\xbf"


INPUTS = {  # name: the bytes of each source
    "ascii": [b"hello world\nthe quick brown fox jumps\n" * 20],
    "latin1": ["naïve café, Ünïcödé ñ ÿ\n".encode() * 20],  # code points below 256
    "cyrillic": ["Съешь же ещё этих мягких булок\n".encode() * 20],
    "astral": ["emoji 🙂 and 🚀, music 𝄞\n".encode() * 20],
    "ascii after a cut character": ["ab€".encode() + b"cd" * 40],
    "bom and crlf": [BOM + b"line one\r\nline two\r\n" * 10, BOM + "é\r\n".encode() * 9],
    "several sources": [b"abc\n" * 30, "Жжж ab\n".encode() * 10,
                        "🙂 x\n".encode() * 7, b"plain ascii again\n" * 5],
    "uint16 ids": ["".join(chr(0x4E00 + i) for i in range(300)).encode() + b"abc\n" * 50],
    "255 characters": ["".join(map(chr, range(1, 256))).encode() * 3],
    "256 characters": ["".join(map(chr, range(1, 257))).encode() * 3, b"ascii only\n" * 30],
}


@pytest.mark.parametrize("chunk", [3, 7, 64, 1 << 20])
@pytest.mark.parametrize("name", INPUTS)
def test_prepare_writes_what_it_wrote_before_its_fast_paths(tmp_path, monkeypatch, name, chunk):
    """ASCII chunks are encoded as bytes, undecoded, Latin-1 text by bytes.translate, the rest
    through numpy: whichever path a chunk takes, and however the chunks cut the characters,
    meta.json, train.bin and val.bin are byte for byte what the plain reference writes (and
    what prepare wrote before, decoding every chunk)."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk)
    paths = []
    for i, raw in enumerate(INPUTS[name]):
        paths.append(tmp_path / f"{i}.txt")
        paths[-1].write_bytes(raw)
    prepare(paths, tmp_path / "ds", 0.1, progress=False)
    written = {f: (tmp_path / "ds" / f).read_bytes() for f in ("meta.json", "train.bin", "val.bin")}
    assert written == reference_dataset(paths, 0.1)


@pytest.mark.parametrize("raw, chunk, offset", [
    (b"abc\xc3" + b"defg" * 3, 4, 3),  # a cut character, then a chunk of ASCII
    (b"abcd\xc3", 4, 4),  # a cut character at the end of the file
    (b"abcd" * 3 + b"\x80", 4, 12),  # a continuation byte after ASCII chunks
])
def test_an_invalid_byte_at_a_chunk_boundary_is_named_at_its_offset(tmp_path, monkeypatch, raw,
                                                                    chunk, offset):
    monkeypatch.setattr(chunks, "CHUNK_BYTES", chunk)
    src = tmp_path / "bad.txt"
    src.write_bytes(raw)
    with pytest.raises(CharlmError) as e:
        prepare([src], tmp_path / "ds", progress=False)
    assert str(e.value) == (
        f"{src} is not valid UTF-8 text (invalid byte 0x{raw[offset]:02x} at byte offset "
        f"{offset}); charlm reads text files as UTF-8, convert it first, or pass --skip-invalid "
        "(data.skip_invalid) to skip such files")


def test_empty_and_single_character_inputs(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(CharlmError, match=f"input file is empty: {empty}"):
        prepare([empty], tmp_path / "ds", progress=False)
    same = tmp_path / "same.txt"
    same.write_text("aaaaaaaa")
    with pytest.raises(CharlmError, match=r"only one distinct character \('a'\)"):
        prepare([same], tmp_path / "ds", progress=False)
    with pytest.raises(CharlmError, match="input file not found"):
        prepare([tmp_path / "missing.txt"], tmp_path / "ds", progress=False)
    with pytest.raises(CharlmError, match="holds no files; give a folder or pattern"):
        (tmp_path / "folder").mkdir()
        prepare([tmp_path / "folder"], tmp_path / "ds", progress=False)


def test_prepare_failure_leaves_existing_dataset_intact(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("hello world, hello world")
    out = tmp_path / "ds"
    prepare([good], out, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\xfe")
    with pytest.raises(CharlmError):
        prepare([bad], out, progress=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_prepare_refuses_a_non_empty_dir_that_is_not_a_dataset(tmp_path):
    """A dataset dir is replaced (prepare again), an unrelated non-empty dir (a run dir, a
    folder of notes) is left alone; an empty one, or one with only a killed prepare's hidden
    temporary files, is used."""
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello world")
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("mine")
    with pytest.raises(CharlmError) as e:
        prepare([text], other, progress=False)
    assert str(e.value) == (f"--out {other} is not empty and holds no charlm dataset; give a new "
                            "or empty directory, or a dataset dir to replace")
    assert [p.name for p in other.iterdir()] == ["todo.txt"]
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / ".train.bin.tmp-123").write_bytes(b"half")
    prepare([text], ds, progress=False)
    text.write_text("another text")
    assert prepare([text], ds, progress=False)["train_tokens"] == 10  # replaced


@pytest.mark.parametrize("meta", ['{"name": "my project"}', "{}", "[1]", "not json"])
def test_prepare_refuses_a_dir_whose_meta_json_is_another_tools(tmp_path, meta):
    """A meta.json that is not a charlm dataset's does not make a directory a dataset dir:
    prepare must not overwrite a project's own meta.json nor write .bin files beside it."""
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello world")
    project = tmp_path / "project"
    project.mkdir()
    (project / "meta.json").write_text(meta)
    (project / "main.py").write_text("print()")
    with pytest.raises(CharlmError) as e:
        prepare([text], project, progress=False)
    assert str(e.value) == (f"--out {project} is not empty and holds no charlm dataset; give a "
                            "new or empty directory, or a dataset dir to replace")
    assert {p.name: p.read_text() for p in project.iterdir()} == {
        "meta.json": meta, "main.py": "print()"}
    (project / "main.py").unlink()  # its meta.json alone: still another tool's
    with pytest.raises(CharlmError):
        prepare([text], project, progress=False)
    assert [p.name for p in project.iterdir()] == ["meta.json"]


@pytest.mark.parametrize("change", ["append known", "append new", "same size"])
def test_prepare_refuses_a_file_that_changes_between_its_reads(tmp_path, monkeypatch, change):
    """Appending during a prepare exited 0 with a meta.json that disagreed with val.bin, and a
    sha256 of another read than the one encoded."""
    src = tmp_path / "in.txt"
    src.write_text("hello world\n" * 100, encoding="utf-8")
    out = tmp_path / "ds"
    prepare([src], out, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_scan = data_module.scan

    def scan_then_change(sources, options, bar=None):
        result = real_scan(sources, options, bar)
        text = src.read_text(encoding="utf-8")
        src.write_text({"append known": text + "low\n", "append new": text + "xyz\n",
                        "same size": text[::-1]}[change], encoding="utf-8")
        return result

    monkeypatch.setattr(data_module, "scan", scan_then_change)
    with pytest.raises(CharlmError) as e:
        prepare([src], out, progress=False)
    assert str(e.value) == (f"{src} changed while prepare read it (the two reads differ); run it "
                            "again once nothing writes to the file")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no temporary file either


def test_prepare_removes_what_a_killed_prepare_left(tmp_path):
    """A SIGKILLed prepare's .train.bin.tmp-PID stayed forever; a live process's is its own."""
    src = tmp_path / "in.txt"
    src.write_text("hello world\n" * 100, encoding="utf-8")
    out = tmp_path / "ds"
    prepare([src], out, progress=False)
    dead, live = out / ".train.bin.tmp-999999999", out / f".val.bin.tmp-{os.getppid()}"
    for path in (dead, live):
        path.write_bytes(b"x" * 100)
    prepare([src], out, progress=False)
    assert not dead.exists() and live.exists()


def test_a_prepare_stopped_between_its_moves_leaves_no_dataset_to_mistake(tmp_path, monkeypatch):
    """Stopped (a signal, a SIGKILL, a power loss) after moving the new train.bin into place
    but before val.bin and meta.json, a prepare left the old meta.json over a mix of new and
    old .bin files, which a reader of the same sizes took for a dataset. meta.json goes first
    now: the dir holds no dataset, which `load_dataset` says, and no temporaries."""
    src = tmp_path / "in.txt"
    src.write_text("hello world\n" * 100, encoding="utf-8")
    out = tmp_path / "ds"
    prepare([src], out, progress=False)
    src.write_text("HELLO WORLD\n" * 100, encoding="utf-8")  # the same sizes, other ids
    real_replace, moves = os.replace, []

    def stop_at_the_second_move(a, b):
        moves.append(b)
        if len(moves) == 2:
            raise KeyboardInterrupt
        real_replace(a, b)

    monkeypatch.setattr(os, "replace", stop_at_the_second_move)
    with pytest.raises(KeyboardInterrupt):
        prepare([src], out, progress=False)
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == ["train.bin", "val.bin"]
    with pytest.raises(CharlmError, match="is not a prepared dataset"):
        load_dataset(out)


def test_a_meta_json_that_is_a_fifo_or_a_device_is_one_error(tmp_path, corpus):
    """prepare --out DIR read DIR/meta.json whole to see whether DIR holds a dataset: a FIFO
    there blocked forever, a symlink to /dev/zero filled the memory."""
    from tests.helpers import raised_reading_fifo

    out = tmp_path / "ds"
    out.mkdir()
    meta = out / "meta.json"
    os.mkfifo(meta)
    e = raised_reading_fifo(meta, lambda: prepare([corpus], out, 0.1, progress=False))
    not_regular = "not a regular file (a directory, FIFO or device); give a regular file"
    assert str(e) == f"cannot read dataset metadata {meta}: {not_regular}"
    meta.unlink()
    meta.symlink_to("/dev/zero")
    with pytest.raises(CharlmError) as e:
        prepare([corpus], out, 0.1, progress=False)
    assert str(e.value) == f"cannot read dataset metadata {meta}: {not_regular}"
    assert sorted(p.name for p in out.iterdir()) == ["meta.json"]


def test_read_text_refuses_a_device_and_a_text_over_its_limit(tmp_path):
    """`charlm eval RUN /dev/zero` died of a MemoryError; a prompt file has a limit."""
    big = tmp_path / "big.txt"
    big.write_bytes(b"a" * 1000)
    assert chunks.read_text(big, "prompt file", 1000) == "a" * 1000
    with pytest.raises(CharlmError) as e:
        chunks.read_text(big, "prompt file", 999)
    assert str(e.value).startswith(f"cannot read prompt file {big}: it holds more than ")
    zero = tmp_path / "zero.txt"
    zero.symlink_to("/dev/zero")
    with pytest.raises(CharlmError) as e:
        chunks.read_text(zero)
    assert str(e.value) == (f"cannot read text file {zero}: not a regular file (a directory, "
                            "FIFO or device); give a regular file")


def test_prepare_in_byte_units_writes_the_files_bytes(tmp_path):
    """units="byte": the vocabulary is the byte values that occur, the ids those of the raw
    bytes (a file that is not UTF-8 too), split as characters are, and meta.json says so."""
    raw = "Ελλάδα 漢字 🙂 ok\n".encode() + b"\xff\xfe latin-1 \xe9\n"
    src = tmp_path / "mixed.bin"
    src.write_bytes(raw)
    meta = prepare([src], tmp_path / "ds", 0.25, progress=False,
                   options=TextOptions(units="byte"))
    assert meta["units"] == "byte"
    assert meta["vocab"] == [chr(b) for b in sorted(set(raw))]
    n_train = int(len(raw) * 0.75)
    assert (meta["train_tokens"], meta["val_tokens"]) == (n_train, len(raw) - n_train)
    ds = load_dataset(tmp_path / "ds")
    assert ds.vocab.units == "byte"
    ids = [sorted(set(raw)).index(b) for b in raw]
    assert ds.train.tolist() + ds.val.tolist() == ids


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
    val = [name for name in texts if chunks.path_share(name) < 0.25]
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
