"""Paired text (charlm.data.pairs and charlm.data.pairs): source<TAB>target lines and their
errors, the split, the prepared dataset, its cache and its damage."""

import json

import numpy as np
import pytest

from charlm.config.data import DataConfig
from charlm.core.errors import CharlmError
from charlm.data.dataset_dir import load_pairs
from charlm.data.datasets import pairs_for
from charlm.data.pairs import PairSplit, PairVocab, read_pairs, references, split_of
from charlm.data.prepare import prepare, prepare_pairs
from tests.helpers import write

SKIP = "or set data.skip_bad_pairs=true to skip such lines"


ONE_PER_LINE = f'give one "source<TAB>target" pair per line, {SKIP}'


SHORTEN = f"raise it, shorten the line, {SKIP}"


AGAIN = "prepare it again with `charlm prepare --pairs`"


def words(n=60, refs=2):
    """Sources w0..w{n-1}; every third has `refs` targets, as CMUdict's variants."""
    lines = []
    for i in range(n):
        lines.append(f"w{i}\tA{'B' * (i % 5)} C")
        if i % 3 == 0:
            lines += [f"w{i}\tD{' E' * r}" for r in range(1, refs)]
    return "\n".join(lines) + "\n"


def space(**kw):
    return DataConfig(**{"path": "pairs.tsv", "target_units": "space", **kw})


@pytest.mark.parametrize("text, kw, line, problem", [
    ("cat\tK AE T\n\ndog D AO G\n", {}, 3,
     f"no tab separator between source and target; {ONE_PER_LINE}"),
    ("cat|K AE T\ndog\tD\n", {"separator": "|"}, 2,
     "no '|' separator between source and target; give one \"source|target\" pair per line, "
     + SKIP),
    ("\tK\n", {}, 1, f"the source is empty; {ONE_PER_LINE}"),
    ("cat\tK\ndog\t   \n", {}, 2, f"the target is empty; {ONE_PER_LINE}"),
    ("abcd\tA\nabcde\tA\n", {}, 2,
     f"the source is 5 characters, over the limit of 4 (model.block_size); {SHORTEN}"),
    ("abc\tA\n", {"max_source_len": 2}, 1,
     f"the source is 3 characters, over the limit of 2 (data.max_source_len); {SHORTEN}"),
    ("ab\tA  B   C\nab\tA B C D\n", {}, 2,
     f"the target is 4 symbols, over the limit of 3 (model.block_size - 1); {SHORTEN}"),
    ("ab\tA B\n", {"max_target_len": 1}, 1,
     f"the target is 2 symbols, over the limit of 1 (data.max_target_len); {SHORTEN}"),
])
def test_a_bad_line_is_one_error_naming_it(tmp_path, text, kw, line, problem):
    path = write(tmp_path / "words.tsv", text)
    with pytest.raises(CharlmError) as e:
        read_pairs(path, space(**kw), block_size=4)
    assert str(e.value) == f"{path} line {line}: {problem}"


def test_char_targets_count_characters(tmp_path):
    path = write(tmp_path / "words.tsv", "ab\tabc\nab\tabcd\n")
    with pytest.raises(CharlmError) as e:
        read_pairs(path, DataConfig(path="p.tsv"), block_size=4)
    assert str(e.value) == (f"{path} line 2: the target is 4 characters, over the limit of 3 "
                            f"(model.block_size - 1); {SHORTEN}")


def test_bad_lines_are_skipped_and_counted(tmp_path):
    path = write(tmp_path / "words.tsv", "cat\tK AE T\nnotab\n\tX\ntoolongsource\tA\ndog\tD AO G\n")
    pairs, skipped = read_pairs(path, space(skip_bad_pairs=True), block_size=8)
    assert pairs == [("cat", "K AE T"), ("dog", "D AO G")] and skipped == 3
    only_bad = write(tmp_path / "bad.tsv", "notab\n\tX\nalso bad\n")
    with pytest.raises(CharlmError) as e:
        read_pairs(only_bad, space(skip_bad_pairs=True), block_size=8)
    assert str(e.value) == (f"{only_bad} holds no pairs (3 bad lines skipped); give one "
                            '"source<TAB>target" pair per line')
    empty = write(tmp_path / "empty.tsv", "\n  \n")
    with pytest.raises(CharlmError, match=f"^{empty} holds no pairs; give one"):
        read_pairs(empty, space(), block_size=8)


def test_bom_crlf_and_space_units(tmp_path):
    path = tmp_path / "w.tsv"
    path.write_bytes(b"\xef\xbb\xbfcat\t K  AE\tT \r\n\r\n \t \r\n dog\tD AO G\r\nx\ty\tz")
    assert read_pairs(path, space(), 16) == ([("cat", "K AE T"), (" dog", "D AO G"),
                                              ("x", "y z")], 0)
    # char units keep the target as written (its tab too), only the line end goes
    assert read_pairs(path, DataConfig(path="p.tsv"), 16)[0] == [
        ("cat", " K  AE\tT "), (" dog", "D AO G"), ("x", "y\tz")]


def test_invalid_utf8_names_the_byte(tmp_path):
    path = tmp_path / "w.tsv"
    path.write_bytes(b"cat\tK\n\xffdog\tD\n")
    with pytest.raises(CharlmError) as e:
        read_pairs(path, space(), 16)
    assert str(e.value) == (f"{path} is not valid UTF-8 text (invalid byte 0xff at byte offset "
                            "6); charlm reads text files as UTF-8, convert it first")


def test_split_of_is_a_fixed_hash_of_the_source():
    # u = sha256(source)[:8] / 2**64: hello 0.176, world 0.283, cat 0.468, dog 0.802
    assert [split_of(w, 0.1, 0.1) for w in ("hello", "world", "cat", "dog")] == [
        "val", "train", "train", "train"]
    assert [split_of(w, 0.3, 0.2) for w in ("hello", "world", "cat", "dog")] == [
        "test", "val", "val", "train"]
    assert split_of("hello", 0.1, 0.0) == "train"
    counts = {"train": 0, "val": 0, "test": 0}
    for i in range(10_000):
        counts[split_of(f"word{i}", 0.1, 0.2)] += 1
    assert abs(counts["val"] - 1000) < 150 and abs(counts["test"] - 2000) < 200


def test_prepare_and_load_round_trip(tmp_path):
    src = write(tmp_path / "words.tsv", words())
    data = space(val_fraction=0.2, test_fraction=0.2)
    meta = prepare_pairs([src], tmp_path / "ds", data, block_size=8)
    ds = load_pairs(tmp_path / "ds")
    pairs, _ = read_pairs(src, data, 8)
    assert ds.vocab == PairVocab(tuple("0123456789w"), ("A", "AB", "ABB", "ABBB", "ABBBB", "C",
                                                         "D", "E"), "space")
    for name in ("train", "val", "test"):
        split = ds.split(name)
        expected = [p for p in pairs if split_of(p[0], 0.2, 0.2) == name]
        assert len(split) == meta["pairs"][name] == len(expected) > 0
        assert [(ds.vocab.decode_source(s), ds.vocab.decode_target(t))
                for s, t in map(split.example, range(len(split)))] == expected
        assert split.src.dtype == np.uint8 and split.tgt_offsets.dtype == np.int64
    saved = json.loads((tmp_path / "ds" / "meta.json").read_text(encoding="utf-8"))
    assert saved == meta == ds.meta
    assert {k: meta[k] for k in ("kind", "target_units", "separator", "max_source_len",
                                 "max_target_len", "skipped")} == {
        "kind": "pairs", "target_units": "space", "separator": "\t", "max_source_len": 8,
        "max_target_len": 7, "skipped": 0}
    assert meta["sources"][0]["path"] == str(src) and len(meta["sources"][0]["sha256"]) == 64
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [
        "meta.json", "test.npz", "train.npz", "val.npz"]


def test_every_reference_of_a_source_is_in_one_split(tmp_path):
    src = write(tmp_path / "words.tsv", words(90, refs=3))
    prepare_pairs([src], tmp_path / "ds", space(val_fraction=0.3, test_fraction=0.3), 8)
    ds = load_pairs(tmp_path / "ds")
    grouped = {name: dict(references(ds.split(name), ds.vocab)) for name in
               ("train", "val", "test")}
    assert sum(len(g) for g in grouped.values()) == 90  # no source in two splits
    assert grouped["train"].get("w0", grouped["val"].get("w0", grouped["test"].get("w0"))) == [
        "A C", "D E", "D E E"]


def test_references_group_targets_by_source_in_first_seen_order():
    vocab = PairVocab(("a", "b"), ("X", "Y"), "space")
    pairs = [([0], [0]), ([1], [1]), ([0], [1, 0]), ([0], [0]), ([1, 0], [0])]
    split = PairSplit(np.array([i for s, _ in pairs for i in s], np.uint8),
                      np.array([0, 1, 2, 3, 4, 6]), np.array([i for _, t in pairs for i in t],
                                                             np.uint8),
                      np.array([0, 1, 2, 4, 5, 6]))
    assert references(split, vocab) == [("a", ["X", "Y X"]), ("b", ["Y"]), ("ba", ["X"])]


def test_train_and_val_must_each_get_a_pair(tmp_path):
    src = write(tmp_path / "w.tsv", "cat\tK\ndog\tD\n")  # u: cat 0.468, dog 0.802
    with pytest.raises(CharlmError) as e:
        prepare_pairs([src], tmp_path / "ds", space(val_fraction=0.1), 8)
    assert str(e.value) == (f"no source of {src} falls in the val split; raise "
                            "data.val_fraction (0.1) or give more pairs")
    with pytest.raises(CharlmError) as e:
        prepare_pairs([src], tmp_path / "ds", space(val_fraction=0.5, test_fraction=0.4), 8)
    assert str(e.value) == (f"no source of {src} falls in the train split; lower "
                            "data.val_fraction (0.5) or data.test_fraction (0.4)")
    assert not (tmp_path / "ds").exists()


def test_prepare_refuses_a_dir_that_is_not_a_dataset(tmp_path):
    src = write(tmp_path / "w.tsv", words())
    notes = tmp_path / "notes"
    notes.mkdir()
    write(notes / "todo.txt", "mine")
    with pytest.raises(CharlmError) as e:
        prepare_pairs([src], notes, space(), 8)
    assert str(e.value) == (f"--out {notes} is not empty and holds no charlm dataset; give a new "
                            "or empty directory, or a dataset dir to replace")
    assert [p.name for p in notes.iterdir()] == ["todo.txt"]
    killed = tmp_path / "killed"  # a prepare stopped before meta.json: replaced
    killed.mkdir()
    (killed / "train.npz").write_bytes(b"half")
    (killed / ".val.npz.tmp-123").write_bytes(b"half")
    assert prepare_pairs([src], killed, space(), 8)["kind"] == "pairs"


def test_bad_input_leaves_a_dataset_dir_as_it_was(tmp_path):
    out = tmp_path / "ds"
    prepare_pairs([write(tmp_path / "w.tsv", words())], out, space(), 8)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = write(tmp_path / "bad.tsv", words() + "notab\n")
    with pytest.raises(CharlmError, match="line 81: no tab separator"):
        prepare_pairs([bad], out, space(), 8)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(CharlmError):
        prepare_pairs([bad], tmp_path / "new", space(), 8)
    assert not (tmp_path / "new").exists()


def _rewrite(ds, split, **arrays):
    with np.load(ds / f"{split}.npz") as z:
        saved = {k: z[k] for k in z.files}
    np.savez(ds / f"{split}.npz", **{**saved, **arrays})


def _unknown_target_id(ds):
    with np.load(ds / "train.npz") as z:
        tgt = z["tgt"].copy()
    tgt[5] = 8  # units 0..7
    _rewrite(ds, "train", tgt=tgt)


@pytest.mark.parametrize("damage, why", [
    (lambda ds: (ds / "meta.json").write_text("{not json"), "Expecting property name"),
    (lambda ds: (ds / "val.npz").unlink(), "No such file or directory"),
    (lambda ds: (ds / "train.npz").write_bytes((ds / "train.npz").read_bytes()[:100]),
     "File is not a zip file"),
    (_unknown_target_id, "train.npz holds target ids outside the 8-unit vocabulary of "
     "meta.json"),
    (lambda ds: _rewrite(ds, "val", src_offsets=np.zeros(3, np.int64)), "val.npz: the source "
     "offsets do not match"),
    (lambda ds: _rewrite(ds, "val", extra=np.zeros(1)), "val.npz holds ['extra', 'src'"),
    (lambda ds: _rewrite(ds, "train", src=np.zeros(3, np.float32)), "train.npz: the source ids "
     "are not a flat array of unsigned ints"),
])
def test_a_damaged_dataset_is_one_error(tmp_path, damage, why):
    ds = tmp_path / "ds"
    prepare_pairs([write(tmp_path / "w.tsv", words())], ds, space(), 8)
    damage(ds)
    with pytest.raises(CharlmError) as e:
        load_pairs(ds)
    message = str(e.value)
    assert message.startswith(f"cannot read dataset {ds}: ") and message.endswith(AGAIN)
    assert why in message and "\n" not in message


def test_a_non_monotonic_offset_and_a_bad_vocab_are_damage(tmp_path):
    ds = tmp_path / "ds"
    prepare_pairs([write(tmp_path / "w.tsv", words())], ds, space(), 8)
    with np.load(ds / "train.npz") as z:
        offsets = z["tgt_offsets"].copy()
    offsets[2] = offsets[1]  # an empty target
    _rewrite(ds, "train", tgt_offsets=offsets)
    with pytest.raises(CharlmError, match="train.npz: the target offsets do not rise from 0"):
        load_pairs(ds)
    meta = json.loads((ds / "meta.json").read_text())
    meta["vocab"]["source"] = ["b", "a", "b"]
    (ds / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CharlmError, match="source vocabulary must be free of duplicates"):
        load_pairs(ds)


def test_a_text_dataset_is_not_pairs(tmp_path):
    text = write(tmp_path / "t.txt", "hello world, hello world")
    prepare([text], tmp_path / "ds", progress=False)
    with pytest.raises(CharlmError) as e:
        load_pairs(tmp_path / "ds")
    assert str(e.value) == (f"{tmp_path / 'ds'} holds a text dataset, not pairs; give a .tsv "
                            "file of pairs or a dataset dir made by `charlm prepare --pairs`")
    with pytest.raises(CharlmError, match="is not a prepared dataset \\(no meta.json\\)"):
        load_pairs(tmp_path)
    # a pairs dataset replaces the text one in place, without its .bin files
    prepare_pairs([write(tmp_path / "w.tsv", words())], tmp_path / "ds", space(), 8)
    assert not list((tmp_path / "ds").glob("*.bin")) and load_pairs(tmp_path / "ds").train


def test_pairs_for_caches_until_the_file_or_a_setting_changes(tmp_path):
    src = write(tmp_path / "w.tsv", words())
    cache = tmp_path / "cache"
    seen = []
    data = space(path=str(src))
    pairs_for(data, 8, cache, seen.append)
    mtime = (cache / "train.npz").stat().st_mtime_ns
    assert pairs_for(data, 8, cache, seen.append).meta["pairs"] and len(seen) == 1
    assert (cache / "train.npz").stat().st_mtime_ns == mtime  # reused, not rewritten
    for changed, block in ((space(path=str(src), val_fraction=0.2), 8),
                           (space(path=str(src), val_fraction=0.2), 9),  # resolved limits
                           (space(path=str(src), val_fraction=0.2, skip_bad_pairs=True), 9)):
        before = len(seen)
        pairs_for(changed, block, cache, seen.append)
        assert len(seen) == before + 1
    write(src, words(30))
    assert sum(pairs_for(data, 8, cache).meta["pairs"].values()) == 40  # was 80
    assert pairs_for(space(path=str(cache)), 8, tmp_path / "unused").meta["sources"][0][
        "sha256"] == load_pairs(cache).meta["sources"][0]["sha256"]


def test_a_rejected_vocab_leaves_the_cache(tmp_path):
    src = write(tmp_path / "w.tsv", words())
    cache = tmp_path / "cache"
    pairs_for(space(path=str(src)), 8, cache)
    before = {p.name: p.read_bytes() for p in cache.iterdir()}
    write(src, "new\tX Y\n" * 3 + words())

    def reject(vocab):
        raise CharlmError(f"other data: {vocab.target[-1]}")

    with pytest.raises(CharlmError, match="other data: Y"):
        pairs_for(space(path=str(src)), 8, cache, reject)
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == before
