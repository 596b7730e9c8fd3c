"""Paired text for the encoder-decoder (G2P, transliteration, spelling): reading
"source<TAB>target" lines, the hashed train/val/test split, `prepare_pairs` into a dataset dir
(its layout and `load_pairs` are `charlm.data.dataset_dir`'s), `pairs_for` (a .tsv prepared
into a cache dir), and `references`, a split's targets grouped by source for multi-reference
accuracy (`charlm.evaluation.accuracy`). The vocabulary is `charlm.data.pair_vocab`'s. It
imports no torch, so `charlm prepare --pairs` starts fast; the batches are
`charlm.data.batches`'."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from charlm.config.data import DataConfig
from charlm.core.errors import CharlmError, characters
from charlm.core.files import discard_temps, remove_killed_temps, synced_temps
from charlm.data.chunks import read_text, sha256_file
from charlm.data.dataset_dir import (
    DATASET_FILES,
    DATASET_FORMAT,
    DATASET_VERSION,
    PAIR_FILES,
    PAIRS_KIND,
    SPLITS,
    PairDataset,
    PairSplit,
    check_out,
    dataset_lock,
    dataset_meta,
    install,
    load_pairs,
    make_dataset_dir,
    path_share,
    read_meta,
    replaceable,
)
from charlm.data.pair_vocab import PairVocab
from charlm.data.sources import check_source_file
from charlm.data.vocab import id_dtype

SKIP_HINT = "set data.skip_bad_pairs=true to skip such lines"


def pair_limits(data: DataConfig, block_size: int) -> tuple[int, int]:
    """The longest source (characters) and target (units) as resolved: a target needs one
    position more than its units in the decoder (its begin id)."""
    return data.max_source_len or block_size, data.max_target_len or block_size - 1


def _pair_form(separator: str) -> str:
    return "source<TAB>target" if separator == "\t" else f"source{separator}target"


def _problem(source: str, found: bool, target: str, data: DataConfig,
             limits: tuple[int, int], target_len: int) -> str | None:
    """Why a line's pair is bad, or None for a good one."""
    sep = data.separator
    one_per_line = f'give one "{_pair_form(sep)}" pair per line, or {SKIP_HINT}'
    if not found:
        name = "tab" if sep == "\t" else repr(sep)
        return f"no {name} separator between source and target; {one_per_line}"
    for what, text in (("source", source), ("target", target)):
        if not text:
            return f"the {what} is empty; {one_per_line}"
    shorten = f"raise it, shorten the line, or {SKIP_HINT}"
    if len(source) > limits[0]:
        which = "data.max_source_len" if data.max_source_len else "model.block_size"
        return (f"the source is {characters(len(source))}, over the limit of {limits[0]} "
                f"({which}); {shorten}")
    if target_len > limits[1]:
        which = "data.max_target_len" if data.max_target_len else "model.block_size - 1"
        unit = "character" if data.target_units == "char" else "symbol"
        return (f"the target is {target_len:,} {unit}s, over the limit of {limits[1]} "
                f"({which}); {shorten}")
    return None


def read_pairs(path: Path, data: DataConfig, block_size: int
               ) -> tuple[list[tuple[str, str]], int]:
    """The (source, target) pairs of a file in order, and how many bad lines were skipped.

    Strict UTF-8 (a byte order mark dropped), CRLF line ends tolerated, whitespace-only lines
    ignored. Each line splits at the first `data.separator`; space-unit targets are normalised
    to single spaces. A bad line is an error naming it, or skipped with data.skip_bad_pairs.
    """
    path = Path(path)
    limits = pair_limits(data, block_size)
    space = data.target_units == "space"
    pairs, skipped = [], 0
    for number, line in enumerate(read_text(path).split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        source, found, target = line.partition(data.separator)
        if space:
            target = " ".join(target.split())
        target_len = target.count(" ") + 1 if space else len(target)
        problem = _problem(source, bool(found), target, data, limits, target_len)
        if problem is None:
            pairs.append((source, target))
        elif data.skip_bad_pairs:
            skipped += 1
        else:
            raise CharlmError(f"{path} line {number}: {problem}")
    if not pairs:
        bad = f" ({skipped:,} bad lines skipped)" if skipped else ""
        raise CharlmError(f'{path} holds no pairs{bad}; give one "{_pair_form(data.separator)}"'
                          " pair per line")
    return pairs, skipped


def split_of(source: str, val_fraction: float, test_fraction: float) -> str:
    """"train", "val" or "test" by a hash of `source`: every reference of one source lands in
    the same split, and the split is the same on every run and machine."""
    u = path_share(source)  # strict UTF-8 text: its encoding is the surrogateescape one
    return "test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"


def pair_settings(data: DataConfig, block_size: int) -> dict[str, Any]:
    """What `prepare_pairs` reads from the config: a cache made with other values is stale."""
    max_source, max_target = pair_limits(data, block_size)
    return {"target_units": data.target_units, "separator": data.separator,
            "val_fraction": data.val_fraction, "test_fraction": data.test_fraction,
            "max_source_len": max_source, "max_target_len": max_target,
            "skip_bad_pairs": data.skip_bad_pairs}


def _encode(pairs: Sequence[tuple[str, str]], vocab: PairVocab) -> dict[str, np.ndarray]:
    srcs = [vocab.encode_source(s) for s, _ in pairs]
    tgts = [vocab.encode_target(t) for _, t in pairs]

    def flat(seqs: list[list[int]], size: int) -> np.ndarray:
        return np.fromiter(itertools.chain.from_iterable(seqs), dtype=id_dtype(size))

    def offsets(seqs: list[list[int]]) -> np.ndarray:
        return np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)

    return {"src": flat(srcs, vocab.source_size), "src_offsets": offsets(srcs),
            "tgt": flat(tgts, vocab.target_size), "tgt_offsets": offsets(tgts)}


def _killed_prepare(out: Path) -> bool:
    """Whether `out` holds only what a prepare of pairs stopped before meta.json leaves: .npz
    files (and hidden temporaries) beside no meta.json, or a damaged one."""
    names = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    if not names <= set(PAIR_FILES) or names == {"meta.json"}:
        return False
    try:
        read_meta(out)
    except (ValueError, OSError):  # missing, or cut short by a crash
        return True
    return False  # readable, yet not a charlm dataset's: another tool's meta.json


def _write(out: Path, arrays: dict[str, dict[str, np.ndarray]], meta: dict[str, Any]) -> None:
    """Every .npz under a temporary name first, then moved into place, meta.json last; whatever
    stops it (an error, SIGINT, SIGTERM) removes its temporaries."""
    make_dataset_dir(out, PAIR_FILES)
    finals = {split: out / f"{split}.npz" for split in SPLITS}
    try:
        with synced_temps(finals.values()) as files:
            for split, f in zip(finals, files, strict=True):
                np.savez(f, **arrays[split])
        install(out, finals.values(), meta)
    except BaseException:
        discard_temps(finals.values())
        raise
    for name in DATASET_FILES:  # the .bin files of a text dataset this one replaced
        if name != "meta.json":
            (out / name).unlink(missing_ok=True)


def prepare_pairs(inputs: Sequence[Path], out: Path, data: DataConfig, block_size: int,
                  check: Callable[[PairVocab], None] | None = None,
                  base: PairVocab | None = None) -> dict[str, Any]:
    """Read pair files, split them by source (`split_of`) and write a dataset dir; returns the
    metadata written to meta.json. `check` sees the vocabulary before anything is written, and
    bad input leaves an existing `out` as it was. It holds the dataset dir's lock throughout.
    With a `base` (a fine-tuned model's vocabulary) the ids are its own, the new units after
    them (`PairVocab.extended`), and meta.json records it as "base"."""
    with dataset_lock(Path(out)):
        return _prepare_pairs([Path(p) for p in inputs], Path(out), data, block_size, check,
                              base)


def _prepare_pairs(paths: list[Path], out: Path, data: DataConfig, block_size: int,
                   check: Callable[[PairVocab], None] | None,
                   base: PairVocab | None = None) -> dict[str, Any]:
    if not paths:
        raise CharlmError("no input files given")
    for p in paths:
        check_source_file(p)
    check_out(out, lambda o: replaceable(o) or _killed_prepare(o))
    # hashed before reading: a file changed meanwhile makes a cache that is rebuilt, not reused
    hashes = [sha256_file(p) for p in paths]
    read = [read_pairs(p, data, block_size) for p in paths]
    pairs = [pair for got, _ in read for pair in got]
    vocab = PairVocab.from_pairs(pairs, data.target_units)  # all splits: eval meets no unknown
    vocab = vocab if base is None else base.extended(vocab)
    splits: dict[str, list[tuple[str, str]]] = {split: [] for split in SPLITS}
    for pair in pairs:
        splits[split_of(pair[0], data.val_fraction, data.test_fraction)].append(pair)
    names = ", ".join(str(p) for p in paths)
    if not splits["train"]:
        raise CharlmError(f"no source of {names} falls in the train split; lower "
                          f"data.val_fraction ({data.val_fraction}) or data.test_fraction "
                          f"({data.test_fraction})")
    if not splits["val"]:
        raise CharlmError(f"no source of {names} falls in the val split; raise "
                          f"data.val_fraction ({data.val_fraction}) or give more pairs")
    if check is not None:
        check(vocab)
    meta = {
        "format": DATASET_FORMAT, "version": DATASET_VERSION, "kind": PAIRS_KIND,
        "vocab": vocab.to_dict(), **pair_settings(data, block_size),
        "skipped": sum(n for _, n in read),
        "sources": [{"path": str(p), "sha256": h, "pairs": len(got), "skipped": n}
                    for p, h, (got, n) in zip(paths, hashes, read, strict=True)],
        "pairs": {split: len(got) for split, got in splits.items()},
        **({} if base is None else {"base": base.to_dict()}),
    }
    _write(out, {split: _encode(got, vocab) for split, got in splits.items()}, meta)
    return meta


def pairs_for(data: DataConfig, block_size: int, cache_dir: Path,
              check: Callable[[PairVocab], None] | None = None,
              base: PairVocab | None = None) -> PairDataset:
    """The pairs of `data.path`: a prepared directory as is, or a pairs file prepared into
    `cache_dir` (reused while the file's sha256, every preparing setting and the `base` are
    unchanged). Before a cache is rebuilt, `check` sees the new vocabulary and may raise: pairs
    it rejects (say, other data for a resumed run) leave the existing cache alone. With a `base`
    (a fine-tuned model's vocabulary) its ids come first (`PairVocab.extended`); a prepared
    directory must already number them so."""
    path = Path(data.path)
    if path.is_dir():
        dataset = load_pairs(path)
        if base is not None and dataset.vocab != base.extended(dataset.vocab):
            raise CharlmError(
                f"dataset {path} numbers its units in its own order, but a fine-tuned model "
                "keeps its parent's ids; give the pairs file it was prepared from as the data, "
                "which charlm train then prepares with the parent's vocabulary")
        return dataset
    check_source_file(path)
    meta = dataset_meta(cache_dir)
    if meta is not None and meta.get("kind") == PAIRS_KIND:
        try:
            settings = pair_settings(data, block_size)
            # made with this base (or none), or numbered as the base itself: a resume's
            same_base = (meta.get("base") is None if base is None else
                         base.to_dict() in (meta.get("base"), meta["vocab"]))
            if ([s["sha256"] for s in meta["sources"]] == [sha256_file(path)] and same_base
                    and all(meta.get(key) == value for key, value in settings.items())):
                remove_killed_temps(cache_dir, PAIR_FILES)  # no prepare will, while reused
                return load_pairs(cache_dir)
        except (KeyError, TypeError, CharlmError):
            pass  # a damaged cache is rebuilt
    prepare_pairs([path], cache_dir, data, block_size, check, base)
    return load_pairs(cache_dir)


def references(split: PairSplit, vocab: PairVocab) -> list[tuple[str, list[str]]]:
    """Each distinct source of `split` in first-seen order, with all its distinct targets: the
    references of multi-reference accuracy."""
    grouped: dict[str, list[str]] = {}
    for i in range(len(split)):
        src, tgt = split.example(i)
        refs = grouped.setdefault(vocab.decode_source(src), [])
        target = vocab.decode_target(tgt)
        if target not in refs:
            refs.append(target)
    return list(grouped.items())
