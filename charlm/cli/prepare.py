"""`charlm prepare`: text files (or paired text) into a dataset dir."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from charlm.cli.options import SetOpt
from charlm.config.data import DataConfig, text_options
from charlm.config.loading import load_config
from charlm.core.errors import CharlmError
from charlm.core.files import locked_parent


def prepare(
    inputs: Annotated[list[str], typer.Argument(
        metavar="INPUT...", help="UTF-8 text: files, folders (every file under them, hidden ones "
        "skipped), quoted globs ('src/**/*.py'), .gz/.bz2/.xz files, - for stdin.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Dataset directory to write.")],
    val_fraction: Annotated[
        float, typer.Option(help="Last fraction of each input used for validation (--split "
                            "files: the share of files; pairs: of sources, by a hash of each).")
    ] = DataConfig.val_fraction,
    split: Annotated[
        str, typer.Option(metavar="tail|files", help="tail: the last --val-fraction of each "
                          "file is validation; files: whole files are, chosen by a hash of "
                          "their path.")
    ] = DataConfig.split,
    skip_invalid: Annotated[
        bool, typer.Option("--skip-invalid", help="Skip (and count) files that are empty or "
                           "not UTF-8 text instead of stopping at the first.")
    ] = False,
    include: Annotated[
        list[str] | None, typer.Option(metavar="PATTERN", help="Of a folder's or glob's files, "
                                       "only those matching (`*.py`; with a /, the path under "
                                       "the folder); repeatable.")
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option(metavar="PATTERN", help="Of a folder's or glob's files, "
                                       "leave out those matching; repeatable.")
    ] = None,
    unicode_normalize: Annotated[
        str | None, typer.Option(metavar="NFC|NFKC|NFD|NFKD", help="Put the text in this "
                                 "Unicode normal form (recorded; prompts and eval text too).")
    ] = None,
    pairs: Annotated[
        bool, typer.Option("--pairs", help="The inputs hold source<TAB>target lines (for "
                           "model.arch=encoder_decoder); --set data.KEY=VALUE sets separator, "
                           "target_units, test_fraction, max_*_len, skip_bad_pairs.")
    ] = False,
    units: Annotated[
        str, typer.Option("--units", help="char: one id a character; byte: one id a byte of "
                          "the files (any file, at most 256 ids; data.units=byte).")
    ] = DataConfig.units,
    benchmark: Annotated[
        str | None, typer.Option("--benchmark", metavar="enwik8|text8", help="INPUT is this "
                                 "benchmark's unzipped file: checked (size, sha256) and split "
                                 "90M / 5M / 5M into train.bin, val.bin and test.bin.")
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Encode text files into a dataset dir: meta.json, train.bin, val.bin (pairs: one .npz
    per split)."""
    if (run := locked_parent(out)) is not None:  # the dataset's own lock is `prepare`'s
        raise CharlmError(f"--out {out} is inside {run}, which a running `charlm train` holds; "
                          "wait for it to end, or choose another --out")
    text = [(key, value) for key, value, default in (
        ("data.split", split, DataConfig.split), ("data.skip_invalid", skip_invalid, False),
        ("data.include", include, None), ("data.exclude", exclude, None),
        ("data.unicode_normalize", unicode_normalize, None), ("data.units", units, "char"))
        if value != default]
    if benchmark is not None:
        prepare_benchmark_file(benchmark, inputs, out, val_fraction,
                               pairs or bool(set_) or bool(text))
        return
    if pairs and text:
        raise CharlmError(f"--{text[0][0][5:].replace('_', '-')} is for text; pairs take "
                          "--set data.KEY=VALUE")
    if pairs:
        from charlm.data.prepare import prepare_pairs

        cfg = load_config(None, [("data.format", "pairs"), ("data.val_fraction", val_fraction),
                                 *(set_ or [])])
        meta = prepare_pairs(inputs, out, cfg.data, cfg.model.block_size)
        counts = " / ".join(f"{n:,} {split}" for split, n in meta["pairs"].items())
        print(f"wrote {out}: {counts} pairs" + (f", {meta['skipped']:,} bad lines skipped"
                                                if meta["skipped"] else ""))
        return
    if set_:
        raise CharlmError("--set applies to --pairs only; text takes --val-fraction")
    from charlm.data.prepare import count_reasons
    from charlm.data.prepare import prepare as prepare_dataset

    data = load_config(None, [("data.val_fraction", val_fraction), *text]).data
    meta = prepare_dataset(inputs, out, val_fraction, options=text_options(data))
    skipped = meta["skipped"]
    print(f"wrote {out}: {meta['vocab_size']} symbols ({meta['dtype']}), "
          f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val "
          f"{'bytes' if data.units == 'byte' else 'characters'} from "
          f"{len(meta['sources']):,} file{'s' if len(meta['sources']) != 1 else ''}"
          + (f"; skipped {len(skipped):,} ({count_reasons(skipped)})" if skipped else ""))


def prepare_benchmark_file(name: str, inputs: list[str], out: Path, val_fraction: float,
                           other: bool) -> None:
    """`charlm prepare --benchmark NAME FILE`: the benchmark fixes the split and the units."""
    from charlm.data.datasets import benchmark, prepare_benchmark

    if len(inputs) != 1:
        raise CharlmError(f"--benchmark {name} takes one file, the benchmark's, got "
                          f"{len(inputs)}")
    if other or val_fraction != DataConfig.val_fraction:
        raise CharlmError("--benchmark fixes the split and the units; leave out --val-fraction, "
                          "--units, --pairs, --set and the other text options")
    if inputs[0] != "-":
        meta = prepare_benchmark(name, inputs[0], out)
    else:
        # stdin copied to a temporary file (it is read twice), at most one byte past the
        # benchmark's size, so a larger input is still refused
        left = benchmark(name).size + 1
        fd, copy = tempfile.mkstemp(prefix=f"charlm-{name}-")
        try:
            with os.fdopen(fd, "wb") as f:
                while left > 0 and (chunk := sys.stdin.buffer.read(min(left, 1 << 20))):
                    f.write(chunk)
                    left -= len(chunk)
            meta = prepare_benchmark(name, copy, out, shown="-")
        finally:
            os.unlink(copy)
    unit = "bytes" if meta.get("units") == "byte" else "characters"
    print(f"wrote {out}: {meta['vocab_size']} symbols ({meta['dtype']}), "
          f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val / "
          f"{meta['test_tokens']:,} test {unit}")

