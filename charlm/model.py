"""The decoder-only GPT, its blocks, and the attention that reads and writes a `KVCache`.

One `Block` class covers the architecture family of `ModelConfig`: position encoding (learned
table, Vaswani's fixed sinusoids, rotary on q and k, or none), LayerNorm or RMSNorm, pre- or
post-norm residuals, and a GELU, ReLU or SwiGLU MLP. The defaults are GPT-2's. The same class
with options is also the encoder block (bidirectional, source padding masked) and the decoder
block with cross-attention of `charlm.seq2seq.EncoderDecoder`.

Shapes: B batch, T time (new tokens this forward), S source length, C n_embd, H n_head,
D head_dim = C // H, F MLP hidden width, V vocab size. No optimizer and no sampling policy
live here.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.config import ModelConfig
from charlm.layers import Embedding, LayerNorm, Linear, Module, child, normal_, param


def attention_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype attention computes in for inputs of `dtype` on `device`: float32 on the CPU,
    where PyTorch's bf16/fp16 flash kernel is slower than its float32 one (much slower in
    backward, docs/benchmarks.md; 2-4x in a decode step without AMX), else `dtype`. A KV cache
    is kept in it, so a decode step converts only the new token's q, k and v."""
    return torch.float32 if device.type == "cpu" else dtype


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool, dropout: float) -> torch.Tensor:
    """SDPA of q (B, H, T, D) over k, v (B, H, S, D) -> (B, H, T, D), in q's dtype, computed in
    `attention_dtype`."""
    dtype = attention_dtype(q.dtype, q.device)
    if dtype != q.dtype:
        with torch.autocast("cpu", enabled=False):  # CPU autocast would cast back to bf16
            y = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype),
                                               attn_mask=mask, dropout_p=dropout,
                                               is_causal=causal)
        return y.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                          is_causal=causal)


def maybe_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, minus the call when it is the identity (decoding runs this per layer per
    token)."""
    return F.dropout(x, p, training) if training and p > 0 else x


class KVCache:
    """Preallocated keys and values for every layer and one write position.

    A plain object (not a module or buffer), so it never lands in a `state_dict`. `pos` is the
    number of positions already written; `GPT.forward` advances it once per call. `pos` may also
    be a 0-d integer tensor on the device: then a forward takes one token per row and attends
    over the whole cache with the positions after `pos` masked, so every step has the same
    shapes and one compiled graph serves them all (`charlm sample --compile`).
    """

    def __init__(self, n_layer: int, batch_size: int, n_head: int, max_len: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype):
        shape = (batch_size, n_head, max_len, head_dim)  # (B, H, L, D)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.max_len = max_len
        self.pos = 0

    def reset(self) -> None:
        self.pos = 0


def sinusoidal_table(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani et al. (2017): PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(same).

    pos (T,) integer positions -> (T, dim) float32. Computed per forward rather than stored, so it
    is never in a `state_dict` and never rounded by `model.to(dtype)`.
    """
    even = torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32)  # 2i
    angles = pos.float()[:, None] / 10000.0 ** (even / dim)  # (T, ceil(dim / 2))
    table = torch.empty(pos.numel(), dim, device=pos.device)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles.cos()[:, : dim // 2]
    return table


def rope_angles(pos: torch.Tensor, head_dim: int,
                base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables (Su et al. 2021) for positions pos (T,): cos and signed sin, each
    (T, D), laid out for `apply_rope`: with angles a_i = p * base^(-2i/D), i < D/2,
    cos = [cos a, cos a] and sin = [-sin a, sin a]."""
    inv_freq = base ** -(torch.arange(0, head_dim, 2, device=pos.device).float() / head_dim)
    angles = pos.float()[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., T, D) by position: feature pair (i, i + D/2) of the token at position p
    turns by angle p * theta_i (the "rotate half" pairing of GPT-NeoX). A rotation keeps norms,
    and the dot product of a query at m with a key at n then depends only on m - n.

    [x1, x2] -> [x1 cos - x2 sin, x1 sin + x2 cos] = x * cos + [x2, x1] * sin, where rolling
    by D/2 swaps the halves: four ops (it runs on q and k together, per layer and step).
    """
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + x.roll(x.size(-1) // 2, dims=-1) * sin


class RMSNorm(Module):
    """x / rms(x) * weight (Zhang & Sennrich 2019): LayerNorm without centring, and never a bias
    (so `bias: true` does not add one here)."""

    weight = param()

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()  # the mean of squares in float32, as LayerNorm does under autocast
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return xf.type_as(x) * weight


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.n_embd)
    return LayerNorm(cfg.n_embd, bias=cfg.bias)


class SelfAttention(Module):
    """Causal (the GPT, the decoder) or bidirectional (the encoder) self-attention."""

    qkv, proj = child(), child()

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__()
        self.n_head = cfg.n_head
        self.causal = causal
        self.qkv = Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # fused q, k, v
        self.proj = Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). rope: `rope_angles` tables (T, D) of the tokens' positions.
        mask (B, 1, 1, T) bool, True = a key to attend to: the encoder's source padding."""
        y = attend(self.qkv(x), self.n_head, cache, layer, rope,
                   self.dropout if self.training else 0.0, self.causal, mask)
        return maybe_dropout(self.proj(y), self.dropout, self.training)


def attend(qkv: torch.Tensor, n_head: int, cache: KVCache | None, layer: int,
           rope: tuple[torch.Tensor, torch.Tensor] | None, dropout: float,
           causal: bool = True, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Self-attention from the fused projections qkv (B, T, 3C) -> (B, T, C), before the
    output projection. With a cache (causal only), the T new keys and values are written at
    cache.pos and the queries attend to everything cached up to them. Without one, `mask`
    (broadcast to (B, H, T, T), True = attend) and `causal` apply."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    # (B, T, 3C) -> 3 x (B, H, T, D), in two view ops (this runs once per token when decoding)
    qkv = qkv.view(B, T, 3, n_head, C // n_head).permute(2, 0, 3, 1, 4)
    if rope is not None:  # rotate before caching: cached keys keep their absolute positions
        (q, k), v = apply_rope(qkv[:2], *rope), qkv[2]  # q and k in one go
    else:
        q, k, v = qkv.unbind(0)
    if cache is None:
        y = attention(q, k, v, mask, causal, dropout)
    elif isinstance(cache.pos, torch.Tensor):  # static shapes: one token at position cache.pos
        at = cache.pos.view(1)
        cache.k[layer].index_copy_(2, at, k)
        cache.v[layer].index_copy_(2, at, v)
        visible = (torch.arange(cache.max_len, device=qkv.device) <= cache.pos)[None]  # (1, L)
        y = attention(q, cache.k[layer], cache.v[layer], visible, False, dropout)
    else:
        start, end = cache.pos, cache.pos + T
        cache_k, cache_v = cache.k[layer], cache.v[layer]  # (B, H, L, D)
        cache_k.narrow(2, start, T).copy_(k)
        cache_v.narrow(2, start, T).copy_(v)
        k, v = cache_k.narrow(2, 0, end), cache_v.narrow(2, 0, end)  # (B, H, end, D)
        if T == 1:  # one new query sees every cached position
            mask, causal = None, False
        elif start == 0:  # prefill from empty: the ordinary causal mask
            mask, causal = None, True
        else:  # T queries at positions start..end-1 over keys 0..end-1
            rows = torch.arange(start, end, device=qkv.device)[:, None]
            mask, causal = torch.arange(end, device=qkv.device)[None, :] <= rows, False
        y = attention(q, k, v, mask, causal, dropout)
    return y.transpose(1, 2).reshape(B, T, C)  # (B, H, T, D) -> (B, T, C)


class CrossAttention(Module):
    """The decoder's attention over the encoder's output: queries from the target, keys and
    values from the source, which `keys_values` projects once per source for every decode step.
    No rotary positions: a target and a source position share no axis to measure along."""

    q, kv, proj = child(), child(), child()

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.q = Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.kv = Linear(cfg.n_embd, 2 * cfg.n_embd, bias=cfg.bias)  # fused k, v
        self.proj = Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output memory (B, S, C) -> k, v, each (B, H, S, D)."""
        B, S, C = memory.shape
        kv = self.kv(memory).view(B, S, 2, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        return kv.to(attention_dtype(kv.dtype, kv.device)).unbind(0)  # converted once per source

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) over k, v (B, H, S, D) from `keys_values`; mask (B, 1, 1, S), True = a
        real source position -> (B, T, C)."""
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, D)
        y = attention(q, k, v, mask, False, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)
        return maybe_dropout(self.proj(y), self.dropout, self.training)


class MLP(Module):
    """proj(act(fc(x))) for gelu and relu; for swiglu (Shazeer 2020) proj(silu(gate(x)) * up(x)),
    with gate and up fused into `fc` (C -> 2F) so it is one matmul."""

    fc, proj = child(), child()

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.ff_width
        self.activation = cfg.activation
        self.fc = Linear(cfg.n_embd, 2 * hidden if cfg.activation == "swiglu" else hidden,
                         bias=cfg.bias)
        self.proj = Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = activate(self.fc(x), self.activation)  # fc: (B, T, F), or (B, T, 2F) for swiglu
        return maybe_dropout(self.proj(h), self.dropout, self.training)


def activate(h: torch.Tensor, kind: str) -> torch.Tensor:
    """The MLP's nonlinearity on fc's output: (B, T, F) -> (B, T, F); swiglu (B, T, 2F) ->
    (B, T, F)."""
    if kind == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.relu(h) if kind == "relu" else gelu(h)


ONEDNN_GELU_FROM = 8192  # values: oneDNN is the faster GELU from there (see `gelu`)


def gelu(h: torch.Tensor) -> torch.Tensor:
    """F.gelu (the exact, erf form). On the CPU, F.gelu hands float32 (and bf16 where the CPU
    has it) to oneDNN, whose fixed cost is about 20 us a call: a decode step's 1,536 values
    took 25 us there against 9 us in PyTorch's own kernel on the EPYC (60 against 16 us inside
    a decode step, about 0.3 ms a token over 6 layers), and oneDNN wins only from about 8,192
    values. So fewer values than that go to PyTorch's kernel, by switching oneDNN off around
    this one call; the two differ by about 1e-7. The switch is process-wide for that moment,
    so an op of another thread then would also skip oneDNN (which changes its speed, and its
    result only within rounding)."""
    if (h.numel() >= ONEDNN_GELU_FROM or h.device.type != "cpu"
            or not torch.backends.mkldnn.enabled or torch.compiler.is_compiling()):
        return F.gelu(h)
    torch.backends.mkldnn.enabled = False
    try:
        return F.gelu(h)
    finally:
        torch.backends.mkldnn.enabled = True


class Block(Module):
    """A transformer block. Pre-norm (GPT-2): x + attn(ln_1(x)), then x + mlp(ln_2(x)).
    Post-norm (Vaswani et al.): ln_1(x + attn(x)), then ln_2(x + mlp(x)).

    causal=False makes the encoder's block (every source position sees the whole source);
    cross=True adds the decoder's cross-attention sublayer between the two, in the same
    residual form: x + cross_attn(ln_cross(x)), or ln_cross(x + cross_attn(x)).
    """

    ln_1, attn, ln_2, mlp = child(), child(), child(), child()
    ln_cross, cross_attn = child(), child()  # with cross=True

    def __init__(self, cfg: ModelConfig, causal: bool = True, cross: bool = False):
        super().__init__()
        self.post_norm = cfg.norm_placement == "post"
        self.ln_1 = make_norm(cfg)
        self.attn = SelfAttention(cfg, causal)
        if cross:  # registered here so a decoder block's state_dict reads in the order it runs
            self.ln_cross = make_norm(cfg)
            self.cross_attn = CrossAttention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache: KVCache | None, layer: int,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None,
                cross: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
                ) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C), for training, prefill and decode alike. mask: the
        self-attention's key mask (encoder). cross: (k, v, mask) for `CrossAttention`, a
        decoder block's view of the source."""
        if self.post_norm:
            x = self.ln_1(x + self.attn(x, cache, layer, rope, mask))
            if cross is not None:
                x = self.ln_cross(x + self.cross_attn(x, *cross))
            return self.ln_2(x + self.mlp(x))
        x = x + self.attn(self.ln_1(x), cache, layer, rope, mask)
        if cross is not None:
            x = x + self.cross_attn(self.ln_cross(x), *cross)
        return x + self.mlp(self.ln_2(x))


def embed(wte: nn.Embedding, wpe: nn.Embedding | None, cfg: ModelConfig, idx: torch.Tensor,
          pos: torch.Tensor) -> torch.Tensor:
    """Token ids idx (B, T) at positions pos (T,) -> input vectors (B, T, C), by the token
    table wte and cfg.pos_encoding (wpe: the learned position table, else None)."""
    tok = wte(idx)  # (B, T, C)
    scheme = cfg.pos_encoding
    if scheme == "learned":
        return tok + wpe(pos)
    if scheme == "sinusoidal":  # scaled so the tokens are not drowned by the unit-size table
        table = sinusoidal_table(pos, cfg.n_embd).to(tok.dtype)
        return tok * math.sqrt(cfg.n_embd) + table
    return tok  # rope turns q and k inside attention; none has no positions at all


def positions(cache: KVCache | None, T: int, block_size: int,
              device: torch.device) -> torch.Tensor:
    """The positions (T,) of T new tokens: after those in the cache, else from 0."""
    if cache is not None and isinstance(cache.pos, torch.Tensor):  # static shapes, T = 1
        return cache.pos.view(1)  # the caller keeps it below block_size (no host sync here)
    start = cache.pos if cache is not None else 0
    if start + T > block_size:
        raise ValueError(f"sequence of {start + T} positions exceeds block_size {block_size}")
    return torch.arange(start, start + T, device=device)


def init_weights(module: nn.Module) -> None:
    """GPT-2's init, for `nn.Module.apply`: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def scale_residual_projections(module: nn.Module, depth: int) -> None:
    """GPT-2's init of the projections that add into the residual stream, N(0, 0.02 /
    sqrt(depth)) for depth additions, so the stream's variance does not grow with depth."""
    for name, p in module.named_parameters():
        if name.endswith("proj.weight"):
            normal_(p, std=0.02 / math.sqrt(depth))


class GPT(Module):
    wte, wpe, blocks, ln_f, head = child(), child(), child(), child(), child()

    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.wte = Embedding(vocab_size, cfg.n_embd)
        if cfg.pos_encoding == "learned":  # the only scheme with a position table to train
            self.wpe = Embedding(cfg.block_size, cfg.n_embd)

        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        # Post-norm blocks already end in a norm, so there is no final one (as in Vaswani et al.).
        self.ln_f = nn.Identity() if cfg.norm_placement == "post" else make_norm(cfg)
        self.head = Linear(cfg.n_embd, vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.wte.weight
        self.apply(init_weights)
        scale_residual_projections(self, 2 * cfg.n_layer)  # an attention and an MLP per block

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        cfg = self.cfg
        p = self.wte.weight
        return KVCache(cfg.n_layer, batch_size, cfg.n_head, max_len or cfg.block_size,
                       cfg.n_embd // cfg.n_head, p.device, attention_dtype(p.dtype, p.device))

    def embed(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Token ids idx (B, T) at positions pos (T,) -> input vectors (B, T, C)."""
        return embed(self.wte, getattr(self, "wpe", None), self.cfg, idx, pos)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) -> logits (B, T, V) and, with targets (B, T), the mean cross-entropy.

        With a cache, the T tokens sit at positions cache.pos .. cache.pos + T - 1, attend to
        everything cached before them, and the cache position advances by T. A cache position
        that is a 0-d tensor means static shapes (see `KVCache`): T = 1, advanced in place.
        """
        T = idx.size(1)
        pos = positions(cache, T, self.cfg.block_size, idx.device)
        x = maybe_dropout(self.embed(idx, pos), self.cfg.dropout, self.training)  # (B, T, C)
        rope = rope_angles(pos, self.cfg.head_dim) if self.cfg.pos_encoding == "rope" else None
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i, rope)
        if cache is not None:
            cache.pos += T
        return logits_and_loss(self, x, targets)


def logits_and_loss(model: nn.Module, x: torch.Tensor, targets: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The last hidden states x (B, T, C) through the model's final norm and head -> logits
    (B, T, V), and with targets (B, T) the mean cross-entropy in float32 over the positions
    whose target is not -1 (an encoder-decoder's padding; a GPT's targets never are). In
    training mode the targets are smoothed by model.label_smoothing; in eval mode never, so
    val losses stay comparable across runs."""
    logits = model.head(model.ln_f(x))  # (B, T, V)
    loss = None
    if targets is not None:
        smoothing = model.cfg.label_smoothing if model.training else 0.0
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                               targets.reshape(-1), ignore_index=-1, label_smoothing=smoothing)
    return logits, loss


def param_counts(model: nn.Module, n_layer: int | None = None) -> dict[str, int]:
    """Parameters per component, each shared (tied) tensor counted once, plus the total.

    `n_layer` (default: the model's) lets a model built with fewer blocks stand for a deeper one:
    its blocks are all alike, so each block component scales by n_layer / len(model.blocks).
    An encoder-decoder counts its own components (`EncoderDecoder.component_counts`).
    """
    if not isinstance(model, GPT):
        return model.component_counts(n_layer)
    groups = {"token_embedding": "wte.", "position_embedding": "wpe.", "attention": ".attn.",
              "mlp": ".mlp.", "norms": "ln_", "head": "head."}
    counts = dict.fromkeys(groups, 0)
    in_blocks = dict.fromkeys(groups, 0)
    for name, p in model.named_parameters():  # yields a tied tensor once, under wte
        component = next(c for c, key in groups.items() if key in f".{name}")
        (in_blocks if name.startswith("blocks.") else counts)[component] += p.numel()
    built = len(model.blocks)
    layers = built if n_layer is None else n_layer
    for component, n in in_blocks.items():
        counts[component] += n // built * layers
    counts["total"] = sum(counts.values())
    return counts


def parameter_count(cfg: ModelConfig, vocab_size: int) -> int:
    """The parameter count of `GPT(cfg, vocab_size)` without building its n_layer blocks: a
    one-layer model on the meta device (no memory) stands for them, so a mistyped
    `model.n_layer=1000000000` is counted at once."""
    with torch.device("meta"):
        model = GPT(dataclasses.replace(cfg, n_layer=1), vocab_size)
    return param_counts(model, cfg.n_layer)["total"]
