"""charlm.data.benchmarks: enwik8 and text8 checked and split 90 / 5 / 5, tested on generated
files in the same formats (the real ones are 100 MB and not shipped): the size and sha256 that
the check expects are pointed at them, with the split scaled down alike."""

import hashlib
import json

import numpy as np
import pytest

from charlm.core.errors import CharlmError
from charlm.data import benchmarks, chunks
from charlm.data.benchmarks import Benchmark, prepare_benchmark
from charlm.data.dataset import load_dataset

# enwik8's format: raw bytes of Wikipedia's XML, UTF-8 with markup, any script
ENWIK = ('<page><title>Ελλάδα</title><text xml:space="preserve">[[Athens|Αθήνα]] &amp; '
         '東京 — “quotes” 🙂</text></page>\n').encode()
# text8's: lowercase a-z and single spaces, no newline
TEXT8 = b"anarchism originated as a term of abuse first used against early working class "


def point_at(monkeypatch, name: str, data: bytes, units: str) -> tuple[int, int, int]:
    """Make BENCHMARKS[name] expect `data`, split 90 / 5 / 5 as the real one is."""
    n = len(data)
    split = (n * 90 // 100, n * 5 // 100, n - n * 90 // 100 - n * 5 // 100)
    monkeypatch.setitem(benchmarks.BENCHMARKS, name, Benchmark(
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
        bench = benchmarks.BENCHMARKS[name]
        assert (bench.size, bench.split, bench.units) == (
            100_000_000, (90_000_000, 5_000_000, 5_000_000), units)
        assert len(bench.sha256) == 64
