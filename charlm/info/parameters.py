"""The parameter table of a GPT or an encoder-decoder, read off the model's own tensors and
checked against its own count, and the FLOPs per token it implies."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn as nn

from charlm.config.schema import ModelConfig
from charlm.info.shapes import CROSS
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT, Block, param_counts

POSITION_ROWS = {
    "sinusoidal": "position encoding (fixed sinusoids, not trained)",
    "rope": "position encoding (rotary, applied to q and k)",
    "none": "position encoding (none)",
}


def _row(section: str, component: str, shape: torch.Tensor | tuple[int, ...] | None) -> dict:
    """One table row of a tensor or a shape; None: no such tensor in this variant."""
    shape = shape.shape if isinstance(shape, torch.Tensor) else shape
    return {"section": section, "component": component,
            "shape": list(shape) if shape is not None else None,
            "params": math.prod(shape) if shape is not None else 0}


def _norm_rows(section: str, label: str, norm: nn.Module) -> list[dict]:
    return [_row(section, f"{label} weight", norm.weight),
            _row(section, f"{label} bias", getattr(norm, "bias", None))]


def _attention_rows(section: str, label: str, inputs: dict[str, nn.Linear], proj: nn.Linear,
                    C: int) -> list[dict]:
    """Rows of one attention: inputs maps q, k, v to the Linear each is C rows of; proj is o."""
    rows = [_row(section, f"{label} {p} weight", (C, C)) for p in inputs]
    rows.append(_row(section, f"{label} o weight", proj.weight))
    rows += [_row(section, f"{label} {p} bias", (C,) if lin.bias is not None else None)
             for p, lin in inputs.items()]
    rows.append(_row(section, f"{label} o bias", proj.bias))
    return rows


def _layer_rows(block: Block, cfg: ModelConfig, section: str = "layer",
                attention: str = "attention") -> list[dict]:
    """Rows for one block, its fused q/k/v and swiglu gate/up split into parts."""
    attn, mlp = block.attn, block.mlp
    C = cfg.n_embd
    rows = _attention_rows(section, attention, dict.fromkeys("qkv", attn.qkv), attn.proj, C)
    sublayers = [(block.ln_1, attention)]
    cross = getattr(block, "cross_attn", None)
    if cross is not None:
        rows += _attention_rows(section, CROSS, {"q": cross.q, "k": cross.kv, "v": cross.kv},
                                cross.proj, C)
        sublayers.append((block.ln_cross, CROSS))
    sublayers.append((block.ln_2, "mlp"))
    hidden = mlp.proj.weight.shape[1]
    has_bias = mlp.fc.bias is not None
    ins = ["gate", "up"] if cfg.activation == "swiglu" else ["up"]  # parts fused in mlp.fc
    rows += [_row(section, f"mlp {p} weight", (hidden, C)) for p in ins]
    rows += [_row(section, f"mlp {p} bias", (hidden,) if has_bias else None) for p in ins]
    rows.append(_row(section, "mlp down weight", mlp.proj.weight))
    rows.append(_row(section, "mlp down bias", mlp.proj.bias))
    where = "after" if cfg.norm_placement == "post" else "before"
    for norm, sub in sublayers:
        rows += _norm_rows(section, f"{cfg.norm} {where} {sub}", norm)
    return rows


def _embedding_rows(wte: nn.Embedding, wpe: nn.Embedding | None, cfg: ModelConfig,
                    prefix: str = "") -> list[dict]:
    rows = [_row("embedding", f"{prefix}token embedding", wte.weight.shape)]
    if cfg.pos_encoding == "learned":
        rows.append(_row("embedding", f"{prefix}position embedding (learned)", wpe.weight.shape))
    else:
        rows.append(_row("embedding", prefix + POSITION_ROWS[cfg.pos_encoding], None))
    return rows


def _final_norm_rows(norm: nn.Module, cfg: ModelConfig, section: str, prefix: str) -> list[dict]:
    if isinstance(norm, nn.Identity):
        return [_row(section, f"{prefix} norm (none: post-norm blocks end in a norm)", None)]
    return _norm_rows(section, f"{prefix} {cfg.norm}", norm)


def _head_row(head: nn.Linear, tied: bool, embedding: str) -> dict:
    return (_row("output", f"head (tied: the {embedding}, no new parameters)", None) if tied
            else _row("output", "head", head.weight.shape))


def _stack(rows: list[dict], section: str, n_layer: int) -> dict[str, int]:
    per_layer = sum(r["params"] for r in rows if r["section"] == section)
    return {"per_layer": per_layer, "n_layer": n_layer, "all_layers": n_layer * per_layer}


def _totals(rows: list[dict], all_layers: int, tied: bool, head: int,
            expected: int) -> dict[str, Any]:
    """The totals of a table whose layer sections (named "... layer") count all_layers."""
    total = sum(r["params"] for r in rows if not r["section"].endswith("layer")) + all_layers
    if total != expected:
        raise RuntimeError("parameter table does not add up to the model's parameters")
    return {"tied": tied, "total": total, "total_tied": total - (0 if tied else head),
            "total_untied": total + (head if tied else 0)}


def parameter_table(model: GPT | EncoderDecoder, n_layer: int | None = None,
                    n_encoder_layer: int | None = None) -> dict[str, Any]:
    """Parameters per component: embeddings, one layer of each stack (times its depth, which
    may exceed the model's, as in `param_counts`), final norms, head, totals tied and untied."""
    if isinstance(model, EncoderDecoder):
        return _encoder_decoder_table(model, n_layer, n_encoder_layer)
    V, C = model.vocab_size, model.cfg.n_embd
    cfg = model.cfg if n_layer is None else dataclasses.replace(model.cfg, n_layer=n_layer)
    rows = _embedding_rows(model.wte, getattr(model, "wpe", None), cfg)
    if cfg.bigram:
        rows.append(_row("embedding", "bigram table (previous, current)", model.bigram.weight))
    rows += _layer_rows(model.blocks[0], cfg)
    rows += _final_norm_rows(model.ln_f, cfg, "output", "final")
    rows.append(_head_row(model.head, cfg.tie_weights, "token embedding"))
    stack = _stack(rows, "layer", cfg.n_layer)
    return {"rows": rows, **stack, **_totals(rows, stack["all_layers"], cfg.tie_weights, V * C,
                                             param_counts(model, cfg.n_layer)["total"])}


def _encoder_decoder_table(model: EncoderDecoder, n_layer: int | None,
                           n_encoder_layer: int | None) -> dict[str, Any]:
    cfg = dataclasses.replace(model.cfg, n_layer=n_layer or model.cfg.n_layer,
                              n_encoder_layer=n_encoder_layer or model.cfg.encoder_layers)
    rows = _embedding_rows(model.src_wte, getattr(model, "src_wpe", None), cfg, "source ")
    rows += _embedding_rows(model.wte, getattr(model, "wpe", None), cfg, "target ")
    rows += _layer_rows(model.encoder[0], cfg, "encoder layer", "self-attention")
    rows += _final_norm_rows(model.ln_enc, cfg, "encoder output", "encoder final")
    rows += _layer_rows(model.blocks[0], cfg, "decoder layer", "self-attention")
    rows += _final_norm_rows(model.ln_f, cfg, "output", "decoder final")
    rows.append(_head_row(model.head, cfg.tie_weights, "target token embedding"))
    encoder = _stack(rows, "encoder layer", cfg.encoder_layers)
    decoder = _stack(rows, "decoder layer", cfg.n_layer)
    expected = model.component_counts(cfg.n_layer, cfg.encoder_layers)["total"]
    head = model.target_vocab_size * cfg.n_embd
    return {"rows": rows, "encoder": encoder, "decoder": decoder,
            **_totals(rows, encoder["all_layers"] + decoder["all_layers"], cfg.tie_weights,
                      head, expected)}


def flops_per_token(table: dict[str, Any], cfg: ModelConfig, vocab_size: int) -> dict[str, int]:
    """FLOPs per token in the PaLM appendix-B style (Chowdhery et al. 2022): N counts all
    parameters but the embedding lookups (the head once, tied or not; norms, being few, too),
    and attention one query over the whole block_size context, not the causal average."""
    L, C, T = cfg.n_layer, cfg.n_embd, cfg.block_size
    lookups = vocab_size * C + (T * C if cfg.pos_encoding == "learned" else 0)
    n = table["total_untied"] - lookups
    attention = 4 * L * C * T  # forward, one token at full context
    return {"N": n, "context": T, "training": 6 * n + 3 * attention,
            "decode_step": 2 * n + attention}


def seq2seq_flops(table: dict[str, Any], cfg: ModelConfig, source_vocab_size: int,
                  target_vocab_size: int) -> dict[str, int]:
    """`flops_per_token` of an encoder-decoder, per target token of a full-length pair
    (S = T = block_size). N_source runs once per source position (the encoder, every decoder
    layer's cross-attention k, v), N_target once per target position (the rest)."""
    L, Le, C = cfg.n_layer, cfg.encoder_layers, cfg.n_embd
    S = T = cfg.block_size
    learned = cfg.pos_encoding == "learned"
    lookups = (source_vocab_size + target_vocab_size) * C + (S + T) * C * learned
    rows = table["rows"]
    kv = sum(r["params"] for r in rows if r["section"] == "decoder layer"
             and r["component"].startswith((f"{CROSS} k ", f"{CROSS} v ")))
    n_source = table["encoder"]["all_layers"] + L * kv + sum(
        r["params"] for r in rows if r["section"] == "encoder output")
    n_target = table["total_untied"] - lookups - n_source
    n = n_source + n_target  # S = T: one source position per target position
    attention = 4 * C * (Le * S + L * T + L * S)  # forward, per target token
    return {"N_source": n_source, "N_target": n_target, "N": n, "source_context": S,
            "context": T, "training": 6 * n + 3 * attention,
            "encode_source": 2 * n_source * S + 4 * Le * C * S * S,
            "decode_step": 2 * n_target + 4 * L * C * (T + S)}
