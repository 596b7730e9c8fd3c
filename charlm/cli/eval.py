"""`charlm eval`: bits per character of a text file, or an encoder-decoder's exact match,
WER and CER on a file of pairs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from charlm.cli.options import DeviceOpt, DtypeOpt, StepOpt, TargetArg
from charlm.config.sampling import SampleConfig
from charlm.core.errors import CharlmError, characters, warn


def eval_(
    target: TargetArg,
    text_file: Annotated[
        Path | None, typer.Argument(metavar="TEXT_FILE", show_default=False,
                                    help="UTF-8 text file to score (.gz/.bz2/.xz too), - for "
                                    "stdin (pairs for an encoder-decoder).")
    ] = None,
    split: Annotated[
        str | None, typer.Option(metavar="val|test", show_default=False,
                                 help="Score the run's own held-out split of its dataset "
                                 "instead of a text file.")
    ] = None,
    stride: Annotated[
        int | None, typer.Option(help="Every scored character after the first window sees at "
                                 "least this many characters of context; windows advance by "
                                 "block_size - stride. "
                                 "[default: block_size // 2]", show_default=False),
    ] = None,
    unknown: Annotated[
        str, typer.Option(help="Characters outside the vocabulary: error or skip.")
    ] = "error",
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    beams: Annotated[
        int | None, typer.Option(help="Encoder-decoder: decode with beam search of N beams "
                                 "(default: greedy).")
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    step: StepOpt = None,
) -> None:
    """Score a text file (or with --split, the run's held-out split): loss in nats/char, bits
    per char, perplexity (a full, deterministic pass in overlapping windows, the text read as it
    is scored). For an encoder-decoder, a file of source<TAB>target pairs: exact match, WER, CER
    (PER for space units) and loss."""
    from charlm.api import load
    from charlm.evaluation.scoring import score_file, score_ids

    if (text_file is None) == (split is None):
        raise CharlmError("give charlm eval a TEXT_FILE to score, or --split val|test for the "
                          "run's held-out split (not both)")
    if split not in (None, "val", "test"):
        raise CharlmError(f"--split must be val or test, got {split!r}")
    lm = load(target, device, dtype, step)
    if lm.config.model.arch == "encoder_decoder":
        if split is not None:
            raise CharlmError("--split scores a GPT's text dataset; give an encoder-decoder "
                              "its file of pairs (its test split: `charlm prepare --pairs`)")
        eval_pairs_file(lm, text_file, unknown, json_out, beams)
        return
    if beams is not None:
        raise CharlmError("--beams applies to an encoder-decoder's eval; a GPT's eval scores "
                          "the text as it is")
    if split is None:
        result = score_file(lm.model, lm.vocab, text_file, stride, unknown)
        units = lm.vocab.units  # a byte model's bits per byte
    else:
        dataset = run_dataset(lm, target, split)
        result = score_ids(lm.model, dataset.split(split), stride)
        units = dataset.meta.get("units", "char")
    for note in result.notes():
        warn(note)
    if json_out:
        extra = {} if split is None else {"split": split, "units": units}
        print(json.dumps({**result.as_dict(), **extra}, allow_nan=False))
        return
    unit = "byte" if units == "byte" else "char"
    counted = (f"{result.chars_scored:,} bytes" if unit == "byte" else
               characters(result.chars_scored))
    print(f"{'' if split is None else f'{split} split: '}loss {result.loss:.4f} nats/{unit}, "
          f"{result.bpc:.4f} bits/{unit}, perplexity {result.perplexity:.3f}, {counted} scored")


def run_dataset(lm: Any, target: Path, split: str) -> Any:
    """The dataset a run trained on, holding `split`: its data.path if that is a dataset dir,
    else the run dir's cache."""
    from charlm.data.dataset_dir import is_dataset_dir, load_dataset
    from charlm.data.datasets import prepared_dir

    if (where := prepared_dir(lm.config.data)) is None:
        run = target if target.is_dir() else target.parent
        where = (run.parent if run.name == "checkpoints" else run) / "dataset"
        if not is_dataset_dir(where):
            raise CharlmError(f"--split {split}: {target} has no prepared dataset (neither "
                              f"{where} nor data.path {lm.config.data.shown} is one); give "
                              "the held-out text as TEXT_FILE instead")
    dataset = load_dataset(where)
    if dataset.vocab != lm.vocab:
        raise CharlmError(f"--split {split}: dataset {where} numbers its characters other than "
                          f"the model of {target} does; give the held-out text as TEXT_FILE")
    if dataset.split(split) is None:
        raise CharlmError(f"--split test: dataset {where} has no test split (only a benchmark "
                          "prepared with `charlm prepare --benchmark` has one); use --split val")
    return dataset


def eval_pairs_file(lm: Any, path: Path, unknown: str, json_out: bool,
                    beams: int | None) -> None:
    """`charlm eval` of an encoder-decoder on a file of pairs, every source's references counted."""
    from charlm.data.pairs import read_pairs
    from charlm.evaluation.pairs import rate_name, score_pairs

    pairs, _ = read_pairs(path, lm.config.data, lm.config.model.block_size)
    grouped: dict[str, list[str]] = {}
    for s, t in pairs:
        grouped.setdefault(s, []).append(t)
    opts = SampleConfig(temperature=0, beams=beams, unknown=unknown)
    result = score_pairs(lm.model, lm.vocab, list(grouped.items()), opts)
    rate = rate_name(lm.vocab)
    if result["references_not_scored"]:
        warn(f"{result['references_not_scored']:,} references hold target units "
             f"outside the model's vocabulary: they count for exact match and {rate} (never "
             "matched), not for the loss")
    if json_out:
        print(json.dumps(result, allow_nan=False))
        return
    loss = ("no loss (no reference in the vocabulary)" if result["loss"] is None else
            f"loss {result['loss']:.4f} nats/unit, {result['bits_per_unit']:.4f} bits/unit")
    print(f"exact match {result['exact_match']:.2%}, WER {result['wer']:.2%}, {rate} "
          f"{result['cer']:.2%} ({result['sources']:,} sources, {result['ref_units']:,} "
          f"reference units), {loss}")
