"""What `charlm info` reports about a model, as plain data the CLI prints as text or JSON."""

from __future__ import annotations

import dataclasses
import math
import textwrap
from pathlib import Path
from typing import Any

import torch

from charlm.config.data import text_options
from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.dataset_dir import load_pairs
from charlm.data.datasets import check_data_kind, text_vocab
from charlm.data.pairs import PairVocab, read_pairs
from charlm.data.sources import missing_inputs
from charlm.info.parameters import flops_per_token, parameter_table, seq2seq_flops
from charlm.info.shapes import forward_shapes, seq2seq_forward_shapes
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT


def config_model(cfg: RunConfig, vocab_size: int | None = None) -> GPT | EncoderDecoder:
    """The model a config describes, one block per stack on the meta device (so one too big for
    memory is described too), its vocabulary from data.path (an encoder-decoder's two: a .tsv
    of pairs or a prepared dir) or a GPT's `vocab_size`."""
    m = cfg.model
    if m.arch != "encoder_decoder":
        if vocab_size is None:
            if missing := missing_inputs(cfg.data.inputs):
                raise CharlmError(f"the vocabulary size comes from data.path, and {missing[0]} "
                                  "does not exist; give --vocab-size N, or --set data.path=FILE")
            vocab_size = len(text_vocab(cfg.data.inputs, text_options(cfg.data)))
        with torch.device("meta"):
            return GPT(dataclasses.replace(m, n_layer=1), vocab_size)
    if vocab_size is not None:
        raise CharlmError("--vocab-size gives one vocabulary, and model.arch=encoder_decoder "
                          "has two (source and target); drop it: both come from data.path")
    path = Path(cfg.data.inputs[0])
    if not path.exists():
        raise CharlmError(f"the source and target vocabularies come from data.path, and {path} "
                          "does not exist; --set data.path=FILE (a .tsv of pairs, or a dataset "
                          "made by `charlm prepare --pairs`)")
    if path.is_dir():
        vocab = load_pairs(path).vocab
    else:
        check_data_kind(cfg, cfg.data.pairs)
        pairs, _ = read_pairs(path, cfg.data, m.block_size)
        vocab = PairVocab.from_pairs(pairs, cfg.data.target_units)
    with torch.device("meta"):
        return EncoderDecoder(dataclasses.replace(m, n_layer=1, n_encoder_layer=1),
                              vocab.source_size, vocab.target_size, vocab.src_pad)


def describe(model: GPT | EncoderDecoder, cfg: RunConfig, shapes: tuple[int, int] | None = None,
             train_state: dict[str, Any] | None = None,
             data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything `charlm info` reports, forward shapes for shapes=(batch, seq_len); `model` may
    have fewer blocks than `cfg` says."""
    m = cfg.model
    table = parameter_table(model, m.n_layer, m.encoder_layers)
    if isinstance(model, EncoderDecoder):
        vocab = (model.source_vocab_size, model.target_vocab_size)
        info: dict[str, Any] = {"arch": m.arch, "source_vocab_size": vocab[0],
                                "target_vocab_size": vocab[1]}
        flops, shapes_of = seq2seq_flops, seq2seq_forward_shapes
    else:
        vocab = (model.vocab_size,)
        info = {"vocab_size": model.vocab_size}
        flops, shapes_of = flops_per_token, forward_shapes
    if train_state is not None:
        best = train_state["best_val"]  # inf until the first evaluation: null in JSON
        info["checkpoint"] = {"step": train_state["step"],
                              "best_val_loss": best if math.isfinite(best) else None,
                              "tokens_seen": train_state["tokens"]}
    if data is not None:
        info["data"] = data
    info["parameters"] = table
    info["flops_per_token"] = flops(table, m, *vocab)
    if shapes is not None:
        info["shapes"] = shapes_of(m, *vocab, *shapes)
    info["config"] = cfg.to_dict()
    return info


def _data_line(data: dict[str, Any]) -> str:
    """`data: 3 files, split tail, 9,000 train / 1,000 val characters; skipped 1 (1 empty)`."""
    unit = "bytes" if data["units"] == "byte" else "characters"
    counts = " / ".join(f"{data[f'{s}_tokens']:,} {s}" for s in ("train", "val", "test")
                        if f"{s}_tokens" in data)
    skipped = f"; skipped {data['skipped']}" if data["skipped"] else ""
    files = f"{data['files']:,} file{'' if data['files'] == 1 else 's'}"
    return f"data: {files}, split {data['split']}, {counts} {unit}{skipped}"


def _fmt_shape(shape: list[int] | None) -> str:
    return " x ".join(map(str, shape)) if shape else "-"


def _flops_lines(f: dict[str, int]) -> list[str]:
    def line(label: str, value: int) -> str:
        return f"  {label:<70}{value:>15,}"

    if "N_source" not in f:
        return [f"FLOPs per token, T = block_size = {f['context']}, N = {f['N']:,} (parameters in "
                "matrix", "multiplies: all but the embedding lookups, the head included even "
                "when tied):",
                line("training, forward + backward: 6N + 12 * n_layer * n_embd * T",
                     f["training"]),
                line("one decode step at full context: 2N + 4 * n_layer * n_embd * T",
                     f["decode_step"])]
    about = (f"FLOPs per target token, S = T = block_size = {f['context']} source and target "
             f"positions, N = N_source + N_target = {f['N_source']:,} + {f['N_target']:,} "
             "(parameters in matrix multiplies: all but the embedding lookups, the head included "
             "even when tied). N_source runs once per source position: the encoder and every "
             "decoder layer's cross-attention k, v. N_target runs once per target position: the "
             "rest of the decoder and the head.")
    return [
        *textwrap.wrap(about, 85),
        "  training, forward + backward of a full-length pair, divided by its T target tokens:",
        line("  6N + 12 * n_embd * (n_encoder_layer * S + n_layer * (T + S))", f["training"]),
        line("encoding one source, once: 2 N_source S + 4 n_encoder_layer n_embd S^2",
             f["encode_source"]),
        line("one decode step at full context: 2 N_target + 4 n_layer n_embd (T + S)",
             f["decode_step"]),
    ]


def render_text(info: dict[str, Any]) -> str:
    if "vocab_size" in info:
        lines = [f"vocab size: {info['vocab_size']}"]
    else:
        lines = [f"architecture: {info['arch']}",
                 f"source vocab size: {info['source_vocab_size']}",
                 f"target vocab size: {info['target_vocab_size']}"]
    if "checkpoint" in info:
        ckpt = info["checkpoint"]
        best = ckpt["best_val_loss"]
        lines += [f"step: {ckpt['step']}",
                  f"best val loss: {'none yet' if best is None else f'{best:.4f}'}",
                  f"tokens seen: {ckpt['tokens_seen']:,}"]
    if "data" in info:
        lines.append(_data_line(info["data"]))
    table = info["parameters"]

    def line(label: str, shape: list[int] | None | str, count: int, indent: int = 2) -> None:
        shown = shape if isinstance(shape, str) else _fmt_shape(shape)
        lines.append(f"{' ' * indent}{label:<{60 - indent}}{shown:>12}{count:>13,}")

    def rows(section: str, indent: int = 2) -> None:
        for r in table["rows"]:
            if r["section"] == section:
                line(r["component"], r["shape"], r["params"], indent)

    def stack(section: str, stats: dict[str, int], name: str = "") -> None:
        lines.append(f"  {name}per layer:")
        rows(section, indent=4)
        line("layer total", "", stats["per_layer"], indent=4)
        line(f"all {name}layers (x {stats['n_layer']})", "", stats["all_layers"])

    lines += ["", f"{'parameters':<60}{'shape':>12}{'count':>13}"]
    rows("embedding")
    if "encoder" in table:
        stack("encoder layer", table["encoder"], "encoder ")
        rows("encoder output")
        stack("decoder layer", table["decoder"], "decoder ")
    else:
        stack("layer", table)
    rows("output")
    line(f"total (head {'tied' if table['tied'] else 'untied'}, as configured)", "",
         table["total"])
    line("total with the head tied", "", table["total_tied"])
    line("total with the head untied", "", table["total_untied"])
    lines += ["", *_flops_lines(info["flops_per_token"])]
    if "shapes" in info:
        lines += ["", f"{'forward pass':<36}{'shape':<20}what"]
        lines += [f"  {s['stage']:<34}{_fmt_shape(s['shape']):<20}{s['what']}"
                  for s in info["shapes"]]
    return "\n".join(lines)
