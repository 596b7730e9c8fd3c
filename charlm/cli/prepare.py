"""`charlm prepare`: text files (or paired text) into a dataset dir."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from charlm.cli.options import SetOpt, command_app
from charlm.config.schema import DataConfig
from charlm.core.errors import CharlmError
from charlm.core.files import locked_parent

app = command_app()

@app.command()
def prepare(
    inputs: Annotated[list[Path], typer.Argument(metavar="INPUT...", help="UTF-8 text files.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Dataset directory to write.")],
    val_fraction: Annotated[
        float, typer.Option(help="Last fraction of each input used for validation (pairs: the "
                            "share of sources, by a hash of each).")
    ] = DataConfig.val_fraction,
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
    if benchmark is not None:
        prepare_benchmark_file(benchmark, inputs, out, val_fraction, units, pairs or bool(set_))
        return
    if units not in ("char", "byte"):
        raise CharlmError(f"--units must be 'char' or 'byte', got {units!r}")
    if pairs and units != "char":
        raise CharlmError("--units byte is for text and a GPT; pairs take characters, leave "
                          "--units out")
    if pairs:
        from charlm.config.loading import load_config
        from charlm.data.pairs import prepare_pairs

        cfg = load_config(None, [("data.format", "pairs"), ("data.val_fraction", val_fraction),
                                 *(set_ or [])])
        meta = prepare_pairs(inputs, out, cfg.data, cfg.model.block_size)
        counts = " / ".join(f"{n:,} {split}" for split, n in meta["pairs"].items())
        print(f"wrote {out}: {counts} pairs" + (f", {meta['skipped']:,} bad lines skipped"
                                                if meta["skipped"] else ""))
        return
    if set_:
        raise CharlmError("--set applies to --pairs only; text takes --val-fraction")
    from charlm.data.corpus import TextOptions
    from charlm.data.text import prepare as prepare_dataset

    meta = prepare_dataset(inputs, out, val_fraction, options=TextOptions(units=units))
    print(f"wrote {out}: {meta['vocab_size']} symbols ({meta['dtype']}), "
          f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val "
          f"{'bytes' if units == 'byte' else 'characters'}")


def prepare_benchmark_file(name: str, inputs: list[Path], out: Path, val_fraction: float,
                           units: str, other: bool) -> None:
    """`charlm prepare --benchmark NAME FILE`: the benchmark fixes the split and the units."""
    from charlm.data.benchmarks import prepare_benchmark

    if len(inputs) != 1:
        raise CharlmError(f"--benchmark {name} takes one file, the benchmark's, got "
                          f"{len(inputs)}")
    if other or val_fraction != DataConfig.val_fraction or units != DataConfig.units:
        raise CharlmError("--benchmark fixes the split and the units; leave out --val-fraction, "
                          "--units, --pairs and --set")
    meta = prepare_benchmark(name, inputs[0], out)
    unit = "bytes" if meta.get("units") == "byte" else "characters"
    print(f"wrote {out}: {meta['vocab_size']} symbols ({meta['dtype']}), "
          f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val / "
          f"{meta['test_tokens']:,} test {unit}")
