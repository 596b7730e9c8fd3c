"""The data a run uses (`prepared_data`): a dataset dir as is, or its text or pairs prepared into
a cache dir, reused while the sources and the settings are unchanged; torch-free, so `charlm
tune` prepares it once for all its trials. And the benchmarks enwik8 and text8 (the first 10^8
bytes of a Wikipedia dump, raw and cleaned; not shipped), checked and split as the papers did."""

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
from charlm.core.files import remove_temps
from charlm.data import prepare
from charlm.data.chunks import sha256_file
from charlm.data.dataset_dir import (
    DATASET_FILES,
    PAIR_FILES,
    PAIRS_KIND,
    SPLITS,
    Dataset,
    PairDataset,
    dataset_lock,
    dataset_meta,
    is_dataset_dir,
    load_dataset,
    load_pairs,
    read_meta,
    source_entry,
    text_meta,
    write_dataset,
)
from charlm.data.pairs import PairVocab, pair_settings
from charlm.data.sources import Source, check_source_file, listed
from charlm.data.vocab import Vocab


def same_base(meta: dict[str, Any], base: Any) -> bool:
    """Whether the cache of `meta` was made with the base vocabulary of state `base` (None:
    none), or is numbered as the base itself (a resume's)."""
    return meta.get("base") is None if base is None else base in (meta.get("base"),
                                                                  meta.get("vocab"))


def own_order(path: Path, what: str, given: str) -> CharlmError:
    """The error for a dataset dir given to a fine-tune whose vocabulary numbers it otherwise."""
    return CharlmError(
        f"dataset {path} numbers its {what} in its own order, but a fine-tuned model keeps its "
        f"parent's ids; give the {given} it was prepared from as the data, which charlm train "
        "then prepares with the parent's vocabulary")


def dataset_for(data_path: str | Path | Sequence[str | Path], val_fraction: float,
                cache_dir: Path, check: Callable[[Vocab], None] | None = None,
                options: TextOptions = TextOptions(), base: Vocab | None = None) -> Dataset:
    """The dataset of `data.path`, a cache reused while `same_sources`. Before a cache is
    rebuilt, `check` sees the text's vocabulary and may raise, leaving the cache alone (other
    data for a resumed run); `base` as `prepare_sources`'s."""
    specs = [data_path] if isinstance(data_path, (str, Path)) else list(data_path)
    if len(specs) == 1 and is_dataset_dir(Path(specs[0])):
        dataset = load_dataset(specs[0])
        if base is not None and dataset.vocab != base.extended(dataset.vocab.chars):
            raise own_order(Path(specs[0]), "characters", "text file")
        return dataset
    with listed(specs, options.include, options.exclude) as sources:
        meta = dataset_meta(cache_dir)
        if (meta is not None and same_base(meta, None if base is None else base.chars)
                and same_sources(meta, sources, val_fraction, options)):
            for name in DATASET_FILES:  # a killed prepare's temporaries: no prepare runs now
                remove_temps(cache_dir / name, only_dead=True)
            with contextlib.suppress(CharlmError):  # a damaged cache (a cut train.bin) is rebuilt
                return load_dataset(cache_dir)
        prepare.prepare_sources(sources, cache_dir, val_fraction, options=options, base=base,
                                check=check)
    return load_dataset(cache_dir)


def text_vocab(specs: Sequence[str | Path], options: TextOptions = TextOptions()) -> Vocab:
    """The vocabulary `dataset_for` would give `specs`, without writing anything."""
    if len(specs) == 1 and is_dataset_dir(Path(specs[0])):
        return load_dataset(specs[0]).vocab
    with listed(specs, options.include, options.exclude) as sources:
        return prepare.scan(sources, options)[2]


def same_sources(meta: dict[str, Any], sources: Sequence[Source], val_fraction: float,
                 options: TextOptions) -> bool:
    """Whether the dataset of `meta` was prepared from `sources` as they are now (the path,
    size and sha256 of every file), with these options; a changed size costs no hashing."""
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


def pairs_for(data: DataConfig, block_size: int, cache_dir: Path,
              check: Callable[[PairVocab], None] | None = None,
              base: PairVocab | None = None) -> PairDataset:
    """`dataset_for` of a pairs file, reused while its sha256, `pair_settings` and `base` hold."""
    path = Path(data.path)
    if path.is_dir():
        dataset = load_pairs(path)
        if base is not None and dataset.vocab != base.extended(dataset.vocab):
            raise own_order(path, "units", "pairs file")
        return dataset
    check_source_file(path)
    meta = dataset_meta(cache_dir)
    if meta is not None and meta.get("kind") == PAIRS_KIND:
        with contextlib.suppress(KeyError, TypeError, CharlmError):  # a damaged cache is rebuilt
            if ([s["sha256"] for s in meta["sources"]] == [sha256_file(path)]
                    and same_base(meta, None if base is None else base.to_dict())
                    and all(meta.get(k) == v for k, v in pair_settings(data, block_size).items())):
                for name in PAIR_FILES:  # a killed prepare's temporaries: no prepare runs now
                    remove_temps(cache_dir / name, only_dead=True)
                return load_pairs(cache_dir)
    prepare.prepare_pairs([path], cache_dir, data, block_size, check, base)
    return load_pairs(cache_dir)


@dataclass(frozen=True)
class Benchmark:
    size: int  # bytes of the file
    sha256: str  # of the unzipped file
    units: str  # "byte" or "char"
    split: tuple[int, int, int]  # train, val, test: consecutive, in units, from the start
    url: str  # where the zip is


# The corpus's author publishes the sizes, not the digests: both are the sha256 of the unzipped
# files as several independent projects pin them, each beside the zip's own digest (enwik8.zip
# 547994d9..., text8.zip a6640522..., as Hugging Face's datasets pin them).
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


def prepare_benchmark(name: str, path: str | Path, out: str | Path, progress: bool = True,
                      shown: str | None = None) -> dict[str, Any]:
    """Check `path` is the benchmark `name` (its size, then its sha256) and write its split into
    the dataset dir `out`; returns its meta.json. `shown`: how messages name the input."""
    bench, path, out = benchmark(name), Path(path), Path(out)
    source = Source(path, shown or str(path), path.name)
    options = TextOptions(units=bench.units)

    def wrong_file(found: str) -> CharlmError:
        return CharlmError(f"{source.name} is not {name}: expected {bench.size:,} bytes with "
                           f"sha256 {bench.sha256}, found {found}; give the file unzipped from "
                           f"{bench.url}")

    with dataset_lock(out):
        prepare.check_prepare([source], out, 0.5)  # the input and --out (the split is its own)
        size = path.stat().st_size
        if size != bench.size:
            raise wrong_file(f"{size:,} bytes")
        with tqdm(total=2 * size, unit="B", unit_scale=True, desc=f"prepare {name}",
                  disable=None if progress else True) as bar:
            [stats], _, vocab = prepare.scan([source], options, bar)
            if stats.sha256 != bench.sha256:
                raise wrong_file(f"sha256 {stats.sha256}")
            if stats.chars != sum(bench.split):
                raise wrong_file(f"{stats.chars:,} {bench.units}s")
            entry = source_entry(source, stats.bytes, stats.sha256, chars=stats.chars)
            meta = text_meta(vocab, bench.split[1] / sum(bench.split),
                             {"units": vocab.units, "split": f"benchmark {name}"},
                             dict(zip(SPLITS, bench.split, strict=True)), sources=[entry])
            ends = [sum(bench.split[:i + 1]) for i in range(len(SPLITS) - 1)]
            write_dataset(out, [out / f"{split}.bin" for split in SPLITS], lambda files:
                          prepare.encode_source(stats, vocab, ends, files, options, bar), meta)
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
    """The run's data; `check` (of the vocabulary's state) and `base` as `dataset_for`'s."""
    pairs = cfg.data.pairs
    if (path := prepared_dir(cfg.data)) is not None:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # the loader says why
            pairs = read_meta(path).get("kind") == PAIRS_KIND
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
    """What `charlm info` says of a run's text, from the meta.json of its dataset dir or of the
    cache in `run_dir`; None when neither holds a text dataset."""
    where = [] if (prepared := prepared_dir(cfg.data)) is None else [prepared]
    meta = next((m for d in [*where, *([run_dir / "dataset"] if run_dir else [])]
                 if (m := dataset_meta(d)) is not None and m.get("kind") != PAIRS_KIND), None)
    if meta is None:
        return None
    return {"split": meta.get("split", "tail"), "units": meta.get("units", "char"),
            "files": len(meta.get("sources", [])),
            "skipped": prepare.count_reasons(meta.get("skipped", [])) or None,
            **{f"{s}_tokens": meta[f"{s}_tokens"] for s in SPLITS if f"{s}_tokens" in meta}}
