"""What `charlm info` reports about a model: a parameter table per component (in the style of a
paper's appendix), FLOPs per token, and the tensor shapes at each stage of one forward pass.

Every function returns plain data (dicts, lists, ints), so the CLI can print it as text or JSON.
The parameter table is read off the model's own tensors and checked against `model.param_counts`,
so it cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn as nn

from charlm.config import ModelConfig, RunConfig
from charlm.errors import CharlmError
from charlm.model import GPT, Block, param_counts

POSITION_ROWS = {
    "sinusoidal": "position encoding (fixed sinusoids, not trained)",
    "rope": "position encoding (rotary, applied to q and k)",
    "none": "position encoding (none)",
}


def _row(section: str, component: str, shape: tuple[int, ...] | torch.Size | None) -> dict:
    """One table row; shape None means the tensor does not exist in this variant (0 params)."""
    return {"section": section, "component": component,
            "shape": list(shape) if shape is not None else None,
            "params": math.prod(shape) if shape is not None else 0}


def _shape(p: torch.Tensor | None) -> torch.Size | None:
    return p.shape if p is not None else None


def _layer_rows(block: Block, cfg: ModelConfig) -> list[dict]:
    """Rows for one block, splitting the fused q/k/v (and swiglu gate/up) tensors into parts."""
    attn, mlp = block.attn, block.mlp
    C = cfg.n_embd
    rows = [_row("layer", f"attention {p} weight", (C, C)) for p in "qkv"]
    rows.append(_row("layer", "attention o weight", attn.proj.weight.shape))
    rows += [_row("layer", f"attention {p} bias", (C,) if attn.qkv.bias is not None else None)
             for p in "qkv"]
    rows.append(_row("layer", "attention o bias", _shape(attn.proj.bias)))
    hidden = mlp.proj.weight.shape[1]
    has_bias = mlp.fc.bias is not None
    ins = ["gate", "up"] if cfg.activation == "swiglu" else ["up"]  # parts fused in mlp.fc
    rows += [_row("layer", f"mlp {p} weight", (hidden, C)) for p in ins]
    rows += [_row("layer", f"mlp {p} bias", (hidden,) if has_bias else None) for p in ins]
    rows.append(_row("layer", "mlp down weight", mlp.proj.weight.shape))
    rows.append(_row("layer", "mlp down bias", _shape(mlp.proj.bias)))
    where = "after" if cfg.norm_placement == "post" else "before"
    for norm, sub in ((block.ln_1, "attention"), (block.ln_2, "mlp")):
        rows.append(_row("layer", f"{cfg.norm} {where} {sub} weight", norm.weight.shape))
        rows.append(_row("layer", f"{cfg.norm} {where} {sub} bias",
                         _shape(getattr(norm, "bias", None))))
    return rows


def parameter_table(model: GPT, n_layer: int | None = None) -> dict[str, Any]:
    """Parameters per component: embeddings, one layer (times n_layer), final norm, head, and
    the totals with the head tied and untied. `n_layer` (default: the model's) lets a model
    built with fewer blocks stand for a deeper one: its blocks are all alike.

    Raises RuntimeError if the rows do not add up to the model's own parameter count.
    """
    V, C = model.vocab_size, model.cfg.n_embd
    cfg = model.cfg if n_layer is None else dataclasses.replace(model.cfg, n_layer=n_layer)
    rows = [_row("embedding", "token embedding", model.wte.weight.shape)]
    if cfg.pos_encoding == "learned":
        rows.append(_row("embedding", "position embedding (learned)", model.wpe.weight.shape))
    else:
        rows.append(_row("embedding", POSITION_ROWS[cfg.pos_encoding], None))
    layer = _layer_rows(model.blocks[0], cfg)
    per_layer = sum(r["params"] for r in layer)
    rows += layer
    if isinstance(model.ln_f, nn.Identity):
        rows.append(_row("output", "final norm (none: post-norm blocks end in a norm)", None))
    else:
        rows.append(_row("output", f"final {cfg.norm} weight", model.ln_f.weight.shape))
        rows.append(_row("output", f"final {cfg.norm} bias",
                         _shape(getattr(model.ln_f, "bias", None))))
    tied = cfg.tie_weights
    rows.append(_row("output", "head (tied: the token embedding, no new parameters)", None)
                if tied else _row("output", "head", model.head.weight.shape))
    outside = sum(r["params"] for r in rows if r["section"] != "layer")
    total = outside + cfg.n_layer * per_layer
    if total != param_counts(model, cfg.n_layer)["total"]:
        raise RuntimeError("parameter table does not add up to the model's parameters")
    head = V * C
    return {
        "rows": rows, "per_layer": per_layer, "n_layer": cfg.n_layer,
        "all_layers": cfg.n_layer * per_layer, "tied": tied, "total": total,
        "total_tied": total - (0 if tied else head), "total_untied": total + (head if tied else 0),
    }


def flops_per_token(table: dict[str, Any], cfg: ModelConfig, vocab_size: int) -> dict[str, int]:
    """FLOPs per token in the PaLM appendix-B style (Chowdhery et al. 2022).

    N counts the parameters that take part in a matrix multiply: everything except the token and
    position embedding lookups, with the head counted once whether tied or not (its matmul runs
    either way). Norm weights and biases are in N too; they are few, and the activation, softmax
    and rotary/sinusoid work is left out, as in the paper. The attention term counts one query
    against the whole context of block_size keys (q.k and weights.v, 2 * n_embd FLOPs each per
    key and layer), not the causal average.
    """
    L, C, T = cfg.n_layer, cfg.n_embd, cfg.block_size
    lookups = vocab_size * C + (T * C if cfg.pos_encoding == "learned" else 0)
    n = table["total_untied"] - lookups
    attention = 4 * L * C * T  # forward, one token at full context
    return {"N": n, "context": T, "training": 6 * n + 3 * attention,
            "decode_step": 2 * n + attention}


def forward_shapes(cfg: ModelConfig, vocab_size: int, batch: int, seq_len: int) -> list[dict]:
    """The tensor shape after each stage of one forward pass of idx (batch, seq_len).

    Runs the real forward on the meta device (shapes only: no memory, no compute), recording
    module outputs with hooks. Block 0 is shown stage by stage; the stages inside the fused
    attention call (heads, rotation, attention weights) are derived from its inputs.
    """
    if not 1 <= seq_len <= cfg.block_size:
        raise CharlmError(f"--seq-len {seq_len} must be in 1..block_size ({cfg.block_size})")
    if batch < 1:
        raise CharlmError(f"--batch must be >= 1, got {batch}")
    with torch.device("meta"):
        model = GPT(cfg, vocab_size).eval()
    B, T, H, D = batch, seq_len, cfg.n_head, cfg.head_dim
    stages = [{"stage": "idx", "what": "token ids", "shape": [B, T]}]

    def add(stage: str, what: str, shape) -> None:
        stages.append({"stage": stage, "what": what, "shape": list(shape)})

    def inside_attention() -> None:
        add("  q, k, v", "split into heads (each)", (B, H, T, D))
        if cfg.pos_encoding == "rope":
            add("  rope", "q, k rotated by position", (B, H, T, D))
        add("  softmax(q k^T / sqrt(D))", "attention weights, causal", (B, H, T, T))
        add("  weights @ v", "per head", (B, H, T, D))
        add("  merge heads", "input to o", (B, T, H * D))

    def inside_mlp() -> None:
        if cfg.activation == "swiglu":
            add("  silu(gate) * up", "swiglu hidden", (B, T, cfg.ff_width))

    watched = {"wte": "token embedding"}
    if cfg.pos_encoding == "learned":
        watched["wpe"] = "position embedding"
    names = {"ln_1": f"{cfg.norm} ({cfg.norm_placement}, attention)", "attn.qkv": "q, k, v",
             "attn.proj": "attention output (o)", "ln_2": f"{cfg.norm} ({cfg.norm_placement}, mlp)",
             "mlp.fc": "mlp gate and up" if cfg.activation == "swiglu" else "mlp up",
             "mlp.proj": "mlp down"}
    watched.update({f"blocks.0.{k}": v for k, v in names.items()})
    watched.update({f"blocks.{i}": f"block {i} output" for i in range(cfg.n_layer)})
    if not isinstance(model.ln_f, nn.Identity):
        watched["ln_f"] = "final norm"
    watched["head"] = "logits"
    after = {"blocks.0.attn.qkv": inside_attention, "blocks.0.mlp.fc": inside_mlp}
    if cfg.pos_encoding == "sinusoidal":
        after["wte"] = lambda: add("  sinusoid table", "added to tokens * sqrt(n_embd)",
                                   (T, cfg.n_embd))

    def hook(name: str):
        def record(module, inputs, output) -> None:
            add(name, watched[name], output.shape)
            if name in after:
                after[name]()
        return record

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n in watched]
    try:
        model(torch.zeros(B, T, dtype=torch.long, device="meta"))
    finally:
        for h in handles:
            h.remove()
    return stages


def describe(model: GPT, cfg: RunConfig, shapes: tuple[int, int] | None = None,
             train_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything `charlm info` reports, as plain data: vocab size, training progress (for a
    checkpoint), parameter table, FLOPs per token, forward shapes for shapes=(batch, seq_len)
    when given, and the resolved config. `model` may have fewer blocks than `cfg` says (a
    one-layer stand-in, see `parameter_table`)."""
    table = parameter_table(model, cfg.model.n_layer)
    info: dict[str, Any] = {"vocab_size": model.vocab_size}
    if train_state is not None:
        best = train_state["best_val"]  # inf until the first evaluation: null in JSON
        info["checkpoint"] = {"step": train_state["step"],
                              "best_val_loss": best if math.isfinite(best) else None,
                              "tokens_seen": train_state["tokens"]}
    info["parameters"] = table
    info["flops_per_token"] = flops_per_token(table, cfg.model, model.vocab_size)
    if shapes is not None:
        info["shapes"] = forward_shapes(cfg.model, model.vocab_size, *shapes)
    info["config"] = cfg.to_dict()
    return info


def _fmt_shape(shape: list[int] | None) -> str:
    return " x ".join(map(str, shape)) if shape else "-"


def render_text(info: dict[str, Any]) -> str:
    """The human-readable form of `charlm info` (see `cli.info` for the keys of `info`)."""
    lines = [f"vocab size: {info['vocab_size']}"]
    if "checkpoint" in info:
        ckpt = info["checkpoint"]
        best = ckpt["best_val_loss"]
        lines += [f"step: {ckpt['step']}",
                  f"best val loss: {'none yet' if best is None else f'{best:.4f}'}",
                  f"tokens seen: {ckpt['tokens_seen']:,}"]
    table = info["parameters"]

    def line(label: str, shape: list[int] | None | str, count: int, indent: int = 2) -> None:
        shown = shape if isinstance(shape, str) else _fmt_shape(shape)
        lines.append(f"{' ' * indent}{label:<{60 - indent}}{shown:>12}{count:>13,}")

    def rows(section: str, indent: int = 2) -> None:
        for r in table["rows"]:
            if r["section"] == section:
                line(r["component"], r["shape"], r["params"], indent)

    lines += ["", f"{'parameters':<60}{'shape':>12}{'count':>13}"]
    rows("embedding")
    lines.append("  per layer:")
    rows("layer", indent=4)
    line("layer total", "", table["per_layer"], indent=4)
    line(f"all layers (x {table['n_layer']})", "", table["all_layers"])
    rows("output")
    line(f"total (head {'tied' if table['tied'] else 'untied'}, as configured)", "",
         table["total"])
    line("total with the head tied", "", table["total_tied"])
    line("total with the head untied", "", table["total_untied"])

    f = info["flops_per_token"]
    lines += [
        "",
        f"FLOPs per token, T = block_size = {f['context']}, N = {f['N']:,} (parameters in matrix",
        "multiplies: all but the embedding lookups, the head included even when tied):",
        f"  {'training, forward + backward: 6N + 12 * n_layer * n_embd * T':<70}"
        f"{f['training']:>15,}",
        f"  {'one decode step at full context: 2N + 4 * n_layer * n_embd * T':<70}"
        f"{f['decode_step']:>15,}",
    ]
    if "shapes" in info:
        lines += ["", f"{'forward pass':<36}{'shape':<20}what"]
        lines += [f"  {s['stage']:<34}{_fmt_shape(s['shape']):<20}{s['what']}"
                  for s in info["shapes"]]
    return "\n".join(lines)
