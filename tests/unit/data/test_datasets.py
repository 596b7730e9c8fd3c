"""charlm.data.datasets: a text file's dataset cache, reused while the text is unchanged and made
again when it changed or was damaged.

charlm.data.datasets: enwik8 and text8 checked and split 90 / 5 / 5, tested on generated
files in the same formats (the real ones are 100 MB and not shipped): the size and sha256 that
the check expects are pointed at them, with the split scaled down alike."""



import hashlib
import json
import os

import numpy as np
import pytest

from charlm.config.data import TextOptions
from charlm.core.errors import CharlmError
from charlm.data import chunks, datasets
from charlm.data.dataset_dir import load_dataset
from charlm.data.datasets import Benchmark, dataset_for, prepare_benchmark
from charlm.data.prepare import prepare
from charlm.data.vocab import Vocab


@pytest.mark.parametrize("meta", [None, "", '{"format": "charlm-da'])
def test_a_dataset_cache_left_without_meta_json_is_rebuilt(tmp_path, meta):
    """A prepare killed after moving train.bin and val.bin into place but before writing
    meta.json, or a machine that stopped before meta.json reached the disk (empty, or cut
    short): the run's dataset cache is prepared again, not refused as a foreign directory
    (every later `charlm train` of the run failed with '--out RUN/dataset is not empty')."""
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello world")
    cache = tmp_path / "run" / "dataset"
    prepare([text], cache, progress=False)
    if meta is None:
        (cache / "meta.json").unlink()
    else:
        (cache / "meta.json").write_text(meta)
    data = dataset_for(text, 0.1, cache)
    assert data.meta["train_tokens"] == 21 and (cache / "meta.json").is_file()


def test_a_damaged_dataset_cache_is_rebuilt(tmp_path):
    """A run's dataset cache whose train.bin no longer matches its meta.json (the text's sha256
    unchanged) failed every later `charlm train` of the run, --overwrite too, with 'prepare it
    again with `charlm prepare`', which the user never ran; now it is prepared again."""
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello world")
    cache = tmp_path / "run" / "dataset"
    dataset_for(text, 0.1, cache)
    (cache / "train.bin").write_bytes(b"\x00" * 5)
    data = dataset_for(text, 0.1, cache)
    assert data.vocab.decode(data.train) == "hello world, hello wo"
    assert (cache / "train.bin").stat().st_size == 21


def test_text_file_is_prepared_once_and_rebuilt_when_changed(tmp_path):
    src = tmp_path / "t.txt"
    src.write_text("abcdefghij" * 20)
    cache = tmp_path / "cache"
    ds = dataset_for(src, 0.1, cache)
    mtime = (cache / "train.bin").stat().st_mtime_ns
    assert dataset_for(src, 0.1, cache).meta == ds.meta
    assert (cache / "train.bin").stat().st_mtime_ns == mtime  # reused, not rewritten
    src.write_text("xyz" * 50)
    ds2 = dataset_for(src, 0.1, cache)
    assert ds2.vocab.chars == ["x", "y", "z"]


def test_a_reused_cache_loses_what_a_killed_prepare_left(tmp_path):
    """A prepare killed while it rebuilt a run's cache left its .train.bin.tmp-PID (668-782 MB
    for a large text) for good: the intact old cache was reused ever after and only a prepare
    removed them. A reuse removes those of dead processes (and prepare meta.json's too); a
    live process's are its own."""
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello world")
    cache = tmp_path / "run" / "dataset"
    dataset_for(text, 0.1, cache)
    before = {p.name: p.read_bytes() for p in cache.iterdir()}
    dead = [cache / f".{name}.tmp-999999999" for name in ("train.bin", "val.bin", "meta.json")]
    live = cache / f".train.bin.tmp-{os.getppid()}"
    for path in (*dead, live):
        path.write_bytes(b"half")
    dataset_for(text, 0.1, cache)
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == {**before, live.name: b"half"}
    text.write_text("another text")
    live.unlink()
    (cache / ".meta.json.tmp-999999999").write_bytes(b"half")
    dataset_for(text, 0.1, cache)  # rebuilt by prepare
    assert sorted(p.name for p in cache.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_a_fine_tune_s_text_keeps_the_parent_s_ids_and_its_own_cache(tmp_path):
    """With a base vocabulary (a parent model's) the ids are the parent's, the new characters
    after them; a cache made with another base, or none, is not reused."""
    text = tmp_path / "t.txt"
    text.write_text("cab, bac")
    cache = tmp_path / "run" / "dataset"
    plain = dataset_for(text, 0.5, cache)
    assert plain.vocab.chars == [" ", ",", "a", "b", "c"] and "base" not in plain.meta
    base = Vocab(list("zcb"))
    data = dataset_for(text, 0.5, cache, base=base)
    assert data.vocab.chars == ["z", "c", "b", " ", ",", "a"] and data.meta["base"] == base.chars
    assert data.vocab.decode(list(data.train) + list(data.val)) == "cab, bac"
    assert list(data.train) == [1, 5, 2, 4]
    mtime = (cache / "train.bin").stat().st_mtime_ns
    assert dataset_for(text, 0.5, cache, base=base).vocab == data.vocab
    assert dataset_for(text, 0.5, cache, base=data.vocab).vocab == data.vocab  # a resume's
    assert (cache / "train.bin").stat().st_mtime_ns == mtime  # both reused
    assert dataset_for(text, 0.5, cache, base=Vocab(list("ab"))).vocab.chars[:2] == ["a", "b"]
    assert dataset_for(text, 0.5, cache).vocab == plain.vocab


def test_a_prepared_dataset_numbered_otherwise_than_the_parent_is_refused(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("cab, bac")
    prepared = tmp_path / "ds"
    prepare([text], prepared, 0.5, progress=False)
    with pytest.raises(CharlmError) as e:
        dataset_for(prepared, 0.5, tmp_path / "cache", base=Vocab(list("cb")))
    assert str(e.value) == (
        f"dataset {prepared} numbers its characters in its own order, but a fine-tuned model "
        "keeps its parent's ids; give the text file it was prepared from as the data, which "
        "charlm train then prepares with the parent's vocabulary")
    assert dataset_for(prepared, 0.5, tmp_path / "c", base=Vocab(list(" ,a"))).vocab.chars == [
        " ", ",", "a", "b", "c"]  # its ids are the parent's already


def test_a_folders_cache_is_keyed_by_each_files_path_size_and_sha256(tmp_path):
    """Editing one file of a folder (even to the same size) prepares again; nothing else does:
    not a touch, not the files' order on disk. A new file, or other options, prepare again."""
    root = tmp_path / "notes"
    root.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (root / name).write_text(f"{name} holds some text of its own\n" * 20)
    cache = tmp_path / "cache"
    dataset_for(root, 0.1, cache)

    def rebuilt():
        mtime = (cache / "meta.json").stat().st_mtime_ns
        data = dataset_for(root, 0.1, cache)
        return data, (cache / "meta.json").stat().st_mtime_ns != mtime

    os.utime(root / "b.txt", (0, 0))
    assert rebuilt()[1] is False
    (root / "b.txt").write_text((root / "b.txt").read_text().replace("some", "SOME"))
    data, again = rebuilt()
    assert again and "S" in data.vocab.chars
    assert rebuilt()[1] is False
    (root / "d.txt").write_text("another file\n" * 20)
    assert rebuilt()[1] is True
    mtime = (cache / "meta.json").stat().st_mtime_ns
    dataset_for(root, 0.1, cache, options=TextOptions(split="files"))
    assert (cache / "meta.json").stat().st_mtime_ns != mtime


def with_test_split(path, ids: bytes) -> None:
    """Give the dataset dir `path` a test split of `ids` (one byte each), as a benchmark's."""
    import json

    (path / "test.bin").write_bytes(ids)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "test_tokens": len(ids)}))


def test_a_test_split_loads_where_meta_json_gives_test_tokens(tmp_path):
    """A benchmark's test.bin was never loaded: Dataset had no test split to score."""
    from charlm.data.dataset_dir import load_dataset

    text = tmp_path / "t.txt"
    text.write_text("hello world, hello world")
    prepare([text], tmp_path / "d", progress=False)
    plain = load_dataset(tmp_path / "d")
    assert plain.test is None and plain.split("test") is None
    assert len(plain.split("train")) == 21 and len(plain.split("val")) == 3
    with_test_split(tmp_path / "d", bytes([0, 1, 2, 3, 4]))
    data = load_dataset(tmp_path / "d")
    assert data.split("test").tolist() == [0, 1, 2, 3, 4] and data.test is data.split("test")
    (tmp_path / "d" / "test.bin").write_bytes(bytes(4))  # cut short
    with pytest.raises(CharlmError, match="test.bin does not match meta.json"):
        load_dataset(tmp_path / "d")


# enwik8's format: raw bytes of Wikipedia's XML, UTF-8 with markup, any script
ENWIK = ('<page><title>Ελλάδα</title><text xml:space="preserve">[[Athens|Αθήνα]] &amp; '
         '東京 — “quotes” 🙂</text></page>\n').encode()
# text8's: lowercase a-z and single spaces, no newline
TEXT8 = b"anarchism originated as a term of abuse first used against early working class "


def point_at(monkeypatch, name: str, data: bytes, units: str) -> tuple[int, int, int]:
    """Make BENCHMARKS[name] expect `data`, split 90 / 5 / 5 as the real one is."""
    n = len(data)
    split = (n * 90 // 100, n * 5 // 100, n - n * 90 // 100 - n * 5 // 100)
    monkeypatch.setitem(datasets.BENCHMARKS, name, Benchmark(
        n, hashlib.sha256(data).hexdigest(), units, split, f"http://example/{name}.zip"))
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 97)  # splits fall inside chunks
    return split


@pytest.mark.parametrize("name, data, units", [("enwik8", ENWIK * 20, "byte"),
                                               ("text8", TEXT8 * 30, "char")])
def test_a_benchmark_is_split_90_5_5_into_train_val_and_test(monkeypatch, tmp_path, name,
                                                             data, units):
    src = tmp_path / name
    src.write_bytes(data)
    n_train, n_val, n_test = point_at(monkeypatch, name, data, units)
    meta = prepare_benchmark(name, src, tmp_path / "ds", progress=False)
    assert (meta["train_tokens"], meta["val_tokens"], meta["test_tokens"]) == (
        n_train, n_val, n_test)
    assert meta["split"] == f"benchmark {name}" and meta.get("units", "char") == units
    assert meta["vocab"] == [chr(b) for b in sorted(set(data))]
    ids = np.array([sorted(set(data)).index(b) for b in data], dtype=np.uint8)
    written = {split: np.fromfile(tmp_path / "ds" / f"{split}.bin", dtype=np.uint8)
               for split in ("train", "val", "test")}
    assert np.array_equal(np.concatenate(list(written.values())), ids)
    assert [len(a) for a in written.values()] == [n_train, n_val, n_test]
    ds = load_dataset(tmp_path / "ds")  # a loader that knows no test.bin reads the rest
    assert (len(ds.train), len(ds.val), ds.vocab.units) == (n_train, n_val, units)
    saved = json.loads((tmp_path / "ds" / "meta.json").read_text(encoding="utf-8"))
    assert saved == meta


def test_a_wrong_file_is_one_error_that_says_what_was_expected(monkeypatch, tmp_path):
    """Wrong size: refused before it is read; right size, wrong bytes: refused by its sha256;
    either way the dataset dir that was there stays as it was."""
    data = ENWIK * 20
    point_at(monkeypatch, "enwik8", data, "byte")
    expected = (f"expected {len(data):,} bytes with sha256 {hashlib.sha256(data).hexdigest()}"
                ", found")
    src, out = tmp_path / "enwik8", tmp_path / "ds"
    src.write_bytes(data)
    prepare_benchmark("enwik8", src, out, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    other = data[:-1] + b"!"
    for wrong, found in ((data[:-1], f"{len(data) - 1:,} bytes"),
                         (other, f"sha256 {hashlib.sha256(other).hexdigest()}")):
        src.write_bytes(wrong)
        with pytest.raises(CharlmError) as e:
            prepare_benchmark("enwik8", src, out, progress=False)
        assert str(e.value) == (f"{src} is not enwik8: {expected} {found}; give the file "
                                "unzipped from http://example/enwik8.zip")
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_the_real_benchmarks_are_100_million_bytes_split_90_5_5():
    for name, units in (("enwik8", "byte"), ("text8", "char")):
        bench = datasets.BENCHMARKS[name]
        assert (bench.size, bench.split, bench.units) == (
            100_000_000, (90_000_000, 5_000_000, 5_000_000), units)
        assert len(bench.sha256) == 64
