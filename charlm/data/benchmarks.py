"""The standard character-level benchmarks, enwik8 and text8 (Matt Mahoney's first 10^8 bytes of
an English Wikipedia dump, raw and cleaned): `prepare_benchmark` checks the file is the one
the papers used and writes the standard split, the first 90M units to train.bin, the next 5M
to val.bin and the last 5M to test.bin (meta.json "test_tokens"), in byte units for enwik8 and
character units for text8 (which is ASCII: its characters are its bytes).

The files are not shipped: `charlm prepare --benchmark enwik8 enwik8 --out DIR` takes the
unzipped file of http://mattmahoney.net/dc/enwik8.zip (text8.zip likewise).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from charlm.core.errors import CharlmError
from charlm.core.files import make_writable_dir, temp_beside
from charlm.data.corpus import TextOptions, encode_source, scan, source_entry
from charlm.data.sources import Source
from charlm.data.text import (
    DATASET_FILES,
    DATASET_FORMAT,
    DATASET_VERSION,
    check_prepare,
    dataset_lock,
    discard_temps,
    install,
    remove_killed_temps,
)


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

SPLITS = ("train", "val", "test")


def benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise CharlmError(f"--benchmark must be one of {', '.join(BENCHMARKS)}, got {name!r}")
    return BENCHMARKS[name]


def wrong_file(name: str, bench: Benchmark, path: Path, found: str) -> CharlmError:
    return CharlmError(
        f"{path} is not {name}: expected {bench.size:,} bytes with sha256 {bench.sha256}, "
        f"found {found}; give the file unzipped from {bench.url}")


def prepare_benchmark(name: str, path: str | Path, out: str | Path,
                      progress: bool = True) -> dict[str, Any]:
    """Check `path` is the benchmark `name` (its size, then its sha256, before anything is
    written) and write its standard split into the dataset dir `out`; the meta.json written."""
    bench, path, out = benchmark(name), Path(path), Path(out)
    source = Source(path, str(path), path.name)
    options = TextOptions(units=bench.units)
    with dataset_lock(out):
        check_prepare([source], out, 0.5)  # the input and --out (the split is the benchmark's)
        size = path.stat().st_size
        if size != bench.size:
            raise wrong_file(name, bench, path, f"{size:,} bytes")
        bar = tqdm(total=2 * size, unit="B", unit_scale=True, desc=f"prepare {name}",
                   disable=None if progress else True)
        final = {split: out / f"{split}.bin" for split in SPLITS}
        try:
            [stats], _, vocab = scan([source], options, bar)
            if stats.sha256 != bench.sha256:
                raise wrong_file(name, bench, path, f"sha256 {stats.sha256}")
            if stats.chars != sum(bench.split):
                raise wrong_file(name, bench, path, f"{stats.chars:,} {bench.units}s")
            make_writable_dir(out, f"dataset dir {out}")
            remove_killed_temps(out, DATASET_FILES)
            with contextlib.ExitStack() as stack:
                files = [stack.enter_context(open(temp_beside(p), "wb")) for p in final.values()]
                ends = [sum(bench.split[:i + 1]) for i in range(len(SPLITS) - 1)]
                encode_source(stats, vocab, ends, files, options, bar)
                for f in files:
                    f.flush()
                    os.fsync(f.fileno())
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
