"""The dataset a run uses (opening a dataset dir is `charlm.data.dataset_dir`'s): `dataset_for`
prepares a text file into a cache dir, reused while the source's sha256 and the val fraction
match. `prepared_data`: which data a run trains
on, its text or pairs prepared into a cache dir where they are not a dataset dir already, and
checked against `model.arch` (torch-free: `charlm tune`'s process prepares it for all trials).

The standard character-level benchmarks, enwik8 and text8 (Matt Mahoney's first 10^8 bytes of
an English Wikipedia dump, raw and cleaned): `prepare_benchmark` checks the file is the one
the papers used and writes the standard split, the first 90M units to train.bin, the next 5M
to val.bin and the last 5M to test.bin (meta.json "test_tokens"), in byte units for enwik8 and
character units for text8 (which is ASCII: its characters are its bytes).

The files are not shipped: `charlm prepare --benchmark enwik8 enwik8 --out DIR` takes the
unzipped file of http://mattmahoney.net/dc/enwik8.zip (text8.zip likewise)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from charlm.config.data import DataConfig, TextOptions, text_options
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.core.files import discard_temps, remove_killed_temps, synced_temps
from charlm.data.chunks import sha256_file
from charlm.data.dataset_dir import (
    DATASET_FILES,
    DATASET_FORMAT,
    DATASET_VERSION,
    SPLITS,
    Dataset,
    PairDataset,
    dataset_lock,
    dataset_meta,
    install,
    is_dataset_dir,
    load_dataset,
    make_dataset_dir,
    read_meta,
)
from charlm.data.pair_vocab import PairVocab
from charlm.data.pairs import pairs_for
from charlm.data.prepare import (
    check_prepare,
    count_reasons,
    encode_source,
    prepare_sources,
    scan,
    source_entry,
)
from charlm.data.sources import Source, as_specs, listed
from charlm.data.vocab import Vocab


def dataset_for(data_path: str | Path | Sequence[str | Path], val_fraction: float,
                cache_dir: Path, check: Callable[[Vocab], None] | None = None,
                options: TextOptions = TextOptions(), base: Vocab | None = None) -> Dataset:
    """The dataset for `data.path`: a prepared directory as is, or text (files, folders, globs:
    `charlm.data.sources`) prepared into `cache_dir`, reused while the files, their sizes and
    sha256 and the options are unchanged (`same_sources`). Before a cache is rebuilt, `check`
    sees the text's vocabulary and may raise: a text it rejects (say, other data for a resumed
    run) leaves the existing cache alone. With a `base` vocabulary (a fine-tuned model's,
    `Vocab.extended`) the ids are its own, the new characters after them; a prepared directory
    must already number them so."""
    specs = as_specs(data_path)
    if len(specs) == 1 and is_dataset_dir(Path(specs[0])):
        dataset = load_dataset(specs[0])
        if base is not None and dataset.vocab != base.extended(dataset.vocab.chars):
            raise CharlmError(
                f"dataset {specs[0]} numbers its characters in its own order, but a fine-tuned "
                "model keeps its parent's ids; give the text file it was prepared from as the "
                "data, which charlm train then prepares with the parent's vocabulary")
        return dataset
    with listed(specs, options.include, options.exclude) as sources:
        meta = dataset_meta(cache_dir)
        # made with this base (or none), or numbered as the base itself: a resume's
        same_base = meta is not None and (meta.get("base") is None if base is None else
                                          base.chars in (meta.get("base"), meta.get("vocab")))
        if same_base and same_sources(meta, sources, val_fraction, options):
            remove_killed_temps(cache_dir, DATASET_FILES)  # no prepare will, while reused
            with contextlib.suppress(CharlmError):  # a damaged cache (a cut train.bin) is rebuilt
                return load_dataset(cache_dir)
        if check is not None:
            vocab = scan(sources, options)[2]
            check(vocab if base is None else base.extended(vocab.chars))
        prepare_sources(sources, cache_dir, val_fraction, options=options, base=base)
    return load_dataset(cache_dir)


def text_vocab(data_path: str | Path | Sequence[str | Path],
               options: TextOptions = TextOptions()) -> Vocab:
    """The vocabulary `dataset_for` would give `data_path`, without writing anything."""
    specs = as_specs(data_path)
    if len(specs) == 1 and is_dataset_dir(Path(specs[0])):
        return load_dataset(specs[0]).vocab
    with listed(specs, options.include, options.exclude) as sources:
        return scan(sources, options)[2]


def same_sources(meta: dict[str, Any], sources: Sequence[Source], val_fraction: float,
                 options: TextOptions) -> bool:
    """Whether the dataset of `meta` was prepared from `sources` as they are now, with these
    options: the sorted (path, size, sha256) of every file, those skipped too. The sizes are
    compared first, so a changed size costs no hashing."""
    try:
        listed = sorted((e["path"], e["bytes"], e["sha256"])
                        for e in [*meta["sources"], *meta["skipped"]])
        if (meta["val_fraction"] != val_fraction
                or {k: meta[k] for k in options.to_dict()} != options.to_dict()):
            return False
        sizes = sorted((s.name, s.path.stat().st_size) for s in sources)
        if sizes != [(path, size) for path, size, _ in listed]:
            return False
        return sorted((s.name, s.path.stat().st_size, sha256_file(s.path))
                      for s in sources) == listed
    except (KeyError, TypeError, ValueError, OSError):
        return False  # a damaged or older cache is rebuilt


@dataclass(frozen=True)
class Benchmark:
    size: int  # bytes of the file
    sha256: str  # of the unzipped file
    units: str  # "byte" or "char"
    split: tuple[int, int, int]  # train, val, test: consecutive, in units, from the start
    url: str  # where the zip is


# Neither digest is published by the corpus's author (his page gives the sizes): both are the
# sha256 of the unzipped files as several independent projects pin them, each beside the zip's
# own digest (enwik8.zip 547994d9..., text8.zip a6640522..., the zips' digests that
# Hugging Face's datasets also pin). Tests point this table at a small generated file.
BENCHMARKS: dict[str, Benchmark] = {
    "enwik8": Benchmark(
        100_000_000, "2b49720ec4d78c3c9fabaee6e4179a5e997302b3a70029f30f2d582218c024a8",
        "byte", (90_000_000, 5_000_000, 5_000_000), "http://mattmahoney.net/dc/enwik8.zip"),
    "text8": Benchmark(
        100_000_000, "6e890197040d37d85beb962ae1f041ff1d9a9ca8d20c7d99c85027eebf51dca7",
        "char", (90_000_000, 5_000_000, 5_000_000), "http://mattmahoney.net/dc/text8.zip"),
}


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise CharlmError(f"--benchmark must be one of {', '.join(BENCHMARKS)}, got {name!r}")
    return BENCHMARKS[name]


def wrong_file(name: str, bench: Benchmark, path: str, found: str) -> CharlmError:
    return CharlmError(
        f"{path} is not {name}: expected {bench.size:,} bytes with sha256 {bench.sha256}, "
        f"found {found}; give the file unzipped from {bench.url}")


def prepare_benchmark(name: str, path: str | Path, out: str | Path, progress: bool = True,
                      shown: str | None = None) -> dict[str, Any]:
    """Check `path` is the benchmark `name` (its size, then its sha256, before anything is
    written) and write its standard split into the dataset dir `out`; the meta.json written.
    `shown`: how messages name the input (`-` for a copy of stdin)."""
    bench, path, out = benchmark(name), Path(path), Path(out)
    source = Source(path, shown or str(path), path.name)
    options = TextOptions(units=bench.units)
    with dataset_lock(out):
        check_prepare([source], out, 0.5)  # the input and --out (the split is the benchmark's)
        size = path.stat().st_size
        if size != bench.size:
            raise wrong_file(name, bench, source.name, f"{size:,} bytes")
        bar = tqdm(total=2 * size, unit="B", unit_scale=True, desc=f"prepare {name}",
                   disable=None if progress else True)
        final = {split: out / f"{split}.bin" for split in SPLITS}
        try:
            [stats], _, vocab = scan([source], options, bar)
            if stats.sha256 != bench.sha256:
                raise wrong_file(name, bench, source.name, f"sha256 {stats.sha256}")
            if stats.chars != sum(bench.split):
                raise wrong_file(name, bench, source.name, f"{stats.chars:,} {bench.units}s")
            make_dataset_dir(out, DATASET_FILES)
            with synced_temps(final.values()) as files:
                ends = [sum(bench.split[:i + 1]) for i in range(len(SPLITS) - 1)]
                encode_source(stats, vocab, ends, files, options, bar)
            meta = {
                "format": DATASET_FORMAT, "version": DATASET_VERSION,
                "vocab": vocab.chars, "vocab_size": len(vocab), "units": vocab.units,
                "dtype": vocab.dtype.name,
                "val_fraction": bench.split[1] / sum(bench.split),
                "split": f"benchmark {name}",
                **{f"{split}_tokens": n for split, n in zip(SPLITS, bench.split, strict=True)},
                "sources": [source_entry(source, stats.bytes, stats.sha256, chars=stats.chars)],
            }
            install(out, final.values(), meta)
        except BaseException:
            discard_temps(final.values())
            raise
        finally:
            bar.close()
    return meta


def check_data_kind(cfg: RunConfig, pairs: bool) -> None:
    """model.arch and the data must agree: a GPT trains on text, an encoder-decoder on pairs."""
    if cfg.model.arch == "encoder_decoder" and not pairs:
        raise CharlmError(
            f"model.arch=encoder_decoder trains on pairs, but {cfg.data.shown} is text; give a "
            "\"source<TAB>target\" file (.tsv, or data.format=pairs) or a dataset made by "
            "`charlm prepare --pairs`"
        )
    if cfg.data.units == "byte" and (pairs or cfg.model.arch == "encoder_decoder"):
        raise CharlmError(
            f"data.units=byte is for text and a GPT, but {cfg.data.shown} is trained as pairs "
            "by an encoder-decoder, whose vocabularies are characters; set data.units=char"
        )
    if cfg.model.arch == "decoder" and pairs:
        raise CharlmError(
            f"{cfg.data.shown} holds pairs, but model.arch=decoder trains on text; set "
            "model.arch=encoder_decoder, or data.format=text to train a GPT on its lines"
        )


def prepared_data(cfg: RunConfig, cache_dir: Path,
                  check: Callable[[Any], None] | None = None,
                  base: Vocab | PairVocab | None = None) -> Dataset | PairDataset:
    """The run's data (a text or .tsv file is prepared into `cache_dir`, reused while
    unchanged). `check` sees the data's vocabulary state before a cache is rebuilt. `base`: a
    fine-tuned model's vocabulary, whose ids the data keeps (new characters after them)."""
    pairs = cfg.data.pairs
    if (path := prepared_dir(cfg.data)) is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # the loader says why
            pairs = read_meta(path).get("kind") == "pairs"
    check_data_kind(cfg, pairs)
    if pairs:
        vocab_check = None if check is None else (lambda v: check(v.to_dict()))
        return pairs_for(cfg.data, cfg.model.block_size, cache_dir, vocab_check,
                         base if isinstance(base, PairVocab) else None)
    text_check = None if check is None else (lambda v: check(v.state()))
    return dataset_for(cfg.data.inputs, cfg.data.val_fraction, cache_dir, text_check,
                       text_options(cfg.data), base if isinstance(base, Vocab) else None)


def prepared_dir(data: DataConfig) -> Path | None:
    """data.path when it is a dataset dir made by `charlm prepare` (not a folder of text)."""
    return Path(data.inputs[0]) if len(data.inputs) == 1 and is_dataset_dir(
        Path(data.inputs[0])) else None


def data_summary(cfg: RunConfig, run_dir: Path | None) -> dict[str, Any] | None:
    """What `charlm info` says of a run's prepared text: its split, units, files, those skipped
    and the tokens of each split, from the meta.json of its dataset dir or of the cache in
    `run_dir`; None when neither holds a text dataset."""
    where = [] if (prepared := prepared_dir(cfg.data)) is None else [prepared]
    meta = next((m for d in [*where, *([run_dir / "dataset"] if run_dir else [])]
                 if (m := dataset_meta(d)) is not None and m.get("kind") != "pairs"), None)
    if meta is None:
        return None
    return {"split": meta.get("split", "tail"), "units": meta.get("units", "char"),
            "files": len(meta.get("sources", [])),
            "skipped": count_reasons(meta.get("skipped", [])) or None,
            **{f"{s}_tokens": meta[f"{s}_tokens"] for s in ("train", "val", "test")
               if f"{s}_tokens" in meta}}
