"""The tensor shape after each stage of one forward pass (`charlm info --shapes`): the real
forward on the meta device (no memory, no compute), module outputs recorded by hooks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from charlm.config.schema import ModelConfig
from charlm.core.errors import CharlmError
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.gpt import GPT

CROSS = "cross-attention"


class _Recorder:
    """Hooks on the modules `watched` (name -> what); `after[name]` adds the stages a module's
    call hides (heads, attention weights), `before[name]` those that precede it."""

    def __init__(self) -> None:
        self.stages: list[dict] = []
        self.watched: dict[str, str] = {}
        self.after: dict[str, Callable[[], None]] = {}
        self.before: dict[str, Callable[[], None]] = {}

    def add(self, stage: str, what: str, shape) -> None:
        self.stages.append({"stage": stage, "what": what, "shape": list(shape)})

    def run(self, model: nn.Module, forward: Callable[[], Any]) -> list[dict]:
        def record(name: str):
            def hook(module, inputs, output) -> None:
                self.add(name, self.watched[name], output.shape)
                if name in self.after:
                    self.after[name]()
            return hook

        handles = []
        for name, module in model.named_modules():
            if name in self.before:
                handles.append(module.register_forward_pre_hook(
                    lambda m, inputs, f=self.before[name]: f()))
            if name in self.watched:
                handles.append(module.register_forward_hook(record(name)))
        try:
            forward()
        finally:
            for h in handles:
                h.remove()
        return self.stages

    def attention(self, cfg: ModelConfig, B: int, T: int, weights: str, key_mask: bool = False,
                  S: int | None = None) -> None:
        """The stages inside one attention call of T queries; with S, cross-attention."""
        H, D = cfg.n_head, cfg.head_dim
        if S is None:
            S = T
            self.add("  q, k, v", "split into heads (each)", (B, H, T, D))
            if cfg.pos_encoding == "rope":
                self.add("  rope", "q, k rotated by position", (B, H, T, D))
        else:
            self.add("  q", "split into heads", (B, H, T, D))
        if key_mask:
            self.add("  key padding mask", "True = a real source position", (B, 1, 1, S))
        self.add("  softmax(q k^T / sqrt(D))", weights, (B, H, T, S))
        self.add("  weights @ v", "per head", (B, H, T, D))
        self.add("  merge heads", "input to o", (B, T, H * D))

    def block(self, cfg: ModelConfig, prefix: str, B: int, T: int, attention: str,
              weights: str, key_mask: bool = False, S: int | None = None) -> None:
        """Watch block `prefix` stage by stage; S (the source length) adds its cross-attention."""
        norm, where = cfg.norm, cfg.norm_placement
        names = {"ln_1": f"{norm} ({where}, {attention})", "attn.qkv": "q, k, v",
                 "attn.proj": f"{attention} output (o)", "ln_2": f"{norm} ({where}, mlp)",
                 "mlp.fc": "mlp gate and up" if cfg.activation == "swiglu" else "mlp up",
                 "mlp.proj": "mlp down"}
        if S is not None:
            names.update({"ln_cross": f"{norm} ({where}, {CROSS})", "cross_attn.q": f"{CROSS} q",
                          "cross_attn.proj": f"{CROSS} output (o)"})
            self.after[f"{prefix}.cross_attn.q"] = lambda: self.attention(
                cfg, B, T, "weights over the memory's keys, padding masked", S=S)
        self.watched.update({f"{prefix}.{k}": v for k, v in names.items()})
        self.after[f"{prefix}.attn.qkv"] = lambda: self.attention(cfg, B, T, weights, key_mask)
        if cfg.activation == "swiglu":
            self.after[f"{prefix}.mlp.fc"] = lambda: self.add(
                "  silu(gate) * up", "swiglu hidden", (B, T, cfg.ff_width))

    def embeddings(self, cfg: ModelConfig, wte: str, wpe: str, T: int, side: str = "") -> None:
        self.watched[wte] = f"{side}token embedding"
        if cfg.pos_encoding == "learned":
            self.watched[wpe] = f"{side}position embedding"
        if cfg.pos_encoding == "sinusoidal":
            self.after[wte] = lambda: self.add("  sinusoid table", "added to tokens * sqrt(n_embd)",
                                               (T, cfg.n_embd))


MAX_LAYERS_SHOWN = 1000  # every block is a row; the meta model is built layer by layer


def _check_sizes(cfg: ModelConfig, batch: int, seq_len: int) -> None:
    if not 1 <= seq_len <= cfg.block_size:
        raise CharlmError(f"--seq-len {seq_len} must be in 1..block_size ({cfg.block_size})")
    if batch < 1:
        raise CharlmError(f"--batch must be >= 1, got {batch}")
    weights = batch * cfg.n_head * seq_len * seq_len
    if weights >= 2**62:  # what torch can size a tensor to, even on the meta device
        raise CharlmError(f"--shapes: the attention weights ({batch} x {cfg.n_head} x {seq_len} "
                          f"x {seq_len}) would have {weights:.3g} elements, more than a tensor "
                          "can hold; give a smaller --seq-len")
    layers = max(cfg.n_layer, cfg.encoder_layers)
    if layers > MAX_LAYERS_SHOWN:
        raise CharlmError(f"--shapes lists every block, and {layers:,} are too many to list; "
                          f"every block has the same shapes: try --set model.n_layer=2")


def forward_shapes(cfg: ModelConfig, vocab_size: int, batch: int, seq_len: int) -> list[dict]:
    """The stages of a GPT's forward of idx (batch, seq_len), block 0's one by one."""
    _check_sizes(cfg, batch, seq_len)
    with torch.device("meta"):
        model = GPT(cfg, vocab_size).eval()
    B, T = batch, seq_len
    rec = _Recorder()
    rec.add("idx", "token ids", (B, T))
    rec.embeddings(cfg, "wte", "wpe", T)
    rec.block(cfg, "blocks.0", B, T, "attention", "attention weights, causal")
    rec.watched.update({f"blocks.{i}": f"block {i} output" for i in range(cfg.n_layer)})
    if not isinstance(model.ln_f, nn.Identity):
        rec.watched["ln_f"] = "final norm"
    rec.watched["head"] = "logits"
    return rec.run(model, lambda: model(torch.zeros(B, T, dtype=torch.long, device="meta")))


def seq2seq_forward_shapes(cfg: ModelConfig, source_vocab_size: int, target_vocab_size: int,
                           batch: int, seq_len: int) -> list[dict]:
    """`forward_shapes` of an encoder-decoder over a source and a target of seq_len each."""
    _check_sizes(cfg, batch, seq_len)
    with torch.device("meta"):
        model = EncoderDecoder(cfg, source_vocab_size, target_vocab_size,
                               source_vocab_size - 1).eval()
    B, S = batch, seq_len
    T, H, D, L, Le = seq_len, cfg.n_head, cfg.head_dim, cfg.n_layer, cfg.encoder_layers
    rec = _Recorder()
    rec.add("src", "source ids", (B, S))
    rec.embeddings(cfg, "src_wte", "src_wpe", S, "source ")
    rec.block(cfg, "encoder.0", B, S, "self-attention",
              "attention weights, bidirectional, padding masked", key_mask=True)
    rec.watched.update({f"encoder.{i}": f"encoder block {i} output" for i in range(Le)})
    last = f"encoder.{Le - 1}"
    if not isinstance(model.ln_enc, nn.Identity):
        rec.watched[last := "ln_enc"] = "encoder final norm"
    rec.after[last] = lambda: rec.add("memory", "the encoder's output", (B, S, cfg.n_embd))
    for i in range(L):
        rec.watched[f"blocks.{i}.cross_attn.kv"] = f"block {i} {CROSS} k, v of the memory"
        rec.after[f"blocks.{i}.cross_attn.kv"] = lambda: rec.add(
            "  k, v", "split into heads (each), once per source", (B, H, S, D))
    rec.before["wte"] = lambda: rec.add("tgt_in", "target ids (bos, then the target)", (B, T))
    rec.embeddings(cfg, "wte", "wpe", T, "target ")
    rec.block(cfg, "blocks.0", B, T, "self-attention", "attention weights, causal", S=S)
    rec.watched.update({f"blocks.{i}": f"decoder block {i} output" for i in range(L)})
    if not isinstance(model.ln_f, nn.Identity):
        rec.watched["ln_f"] = "decoder final norm"
    rec.watched["head"] = "logits"
    ids = torch.zeros(B, S, dtype=torch.long, device="meta")
    return rec.run(model, lambda: model(ids, ids))
