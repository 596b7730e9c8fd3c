"""The decoder-only GPT and its `Block`, which covers `ModelConfig`'s architecture family
(position encoding, LayerNorm or RMSNorm, pre- or post-norm, GELU, ReLU or SwiGLU; GPT-2's by
default) and is also the encoder-decoder's encoder and decoder block."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.config.schema import ModelConfig
from charlm.model import attention
from charlm.model.attention import KVCache
from charlm.model.layers import Embedding, Linear, maybe_dropout, normal_


def sinusoidal_table(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """Vaswani et al.'s PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(same): pos
    (T,) -> (T, dim) float32. Computed per forward, so never in a `state_dict` nor rounded."""
    even = torch.arange(0, dim, 2, device=pos.device, dtype=torch.float32)  # 2i
    angles = pos.float()[..., None] / 10000.0 ** (even / dim)  # (..., T, ceil(dim / 2))
    table = torch.empty(*pos.shape, dim, device=pos.device)
    table[..., 0::2] = angles.sin()
    table[..., 1::2] = angles.cos()[..., : dim // 2]
    return table


class RMSNorm(nn.Module):
    """x / rms(x) * weight (Zhang & Sennrich 2019): LayerNorm without centring, never a bias."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return attention.unit_rms(x) * self.weight  # the mean of squares in float32


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return RMSNorm(cfg.n_embd)
    return nn.LayerNorm(cfg.n_embd, bias=cfg.bias)


class MLP(nn.Module):
    """proj(act(fc(x))); SwiGLU's (Shazeer 2020) gate and up fused in `fc` (C -> 2F)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.ff_width
        self.activation = cfg.activation
        self.fc = Linear(cfg.n_embd, 2 * hidden if cfg.activation == "swiglu" else hidden,
                         bias=cfg.bias)
        self.proj = Linear(hidden, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # (B, T, F), or (B, T, 2F) for swiglu
        if self.activation == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.activation == "relu2":
            h = F.relu(h).square()
        else:
            h = F.relu(h) if self.activation == "relu" else F.gelu(h)
        return maybe_dropout(self.proj(h), self.dropout, self.training)


Cross = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # `CrossAttention`'s k, v and mask


class Block(nn.Module):
    """Pre-norm (GPT-2): x + attn(ln_1(x)), then x + mlp(ln_2(x)); post-norm (Vaswani et al.):
    ln_1(x + attn(x)), then ln_2(x + mlp(x)). causal=False: the encoder's block; cross=True
    adds the decoder's cross-attention between the two, in the same residual form."""

    def __init__(self, cfg: ModelConfig, causal: bool = True, cross: bool = False):
        super().__init__()
        self.post_norm = cfg.norm_placement == "post"
        self.ln_1 = make_norm(cfg)
        self.attn = attention.SelfAttention(cfg, causal)
        if cross:  # registered here so a decoder block's state_dict reads in the order it runs
            self.ln_cross = make_norm(cfg)
            self.cross_attn = attention.CrossAttention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache: KVCache | None, layer: int,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None,
                cross: Cross | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C); mask: the encoder's; cross: `CrossAttention`'s k, v, mask."""
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
    """Token ids idx (B, T) at positions pos (T,) or (B, T) -> input vectors (B, T, C), by
    cfg.pos_encoding (wpe: the learned position table, else None)."""
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
    """The positions (T,) of T new tokens after the cache's; (1, 1) or (B, 1) for a tensor."""
    if cache is not None and isinstance(cache.pos, torch.Tensor):
        return cache.pos.view(-1, 1)  # the caller keeps it below block_size (no host sync here)
    start = cache.pos if cache is not None else 0
    if start + T > block_size:
        raise ValueError(f"sequence of {start + T} positions exceeds block_size {block_size}")
    return torch.arange(start, start + T, device=device)


def rope_tables(cfg: ModelConfig, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    return attention.rope_angles(pos, cfg.head_dim) if cfg.pos_encoding == "rope" else None


def init_weights(module: nn.Module) -> None:
    """GPT-2's init, for `nn.Module.apply`: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def scale_residual_projections(module: nn.Module, depth: int, zero: bool = False) -> None:
    """GPT-2's N(0, 0.02 / sqrt(depth)) for the projections into the residual stream, so it does
    not grow with depth; `zero` (`model.zero_init`): each block starts as the identity."""
    for name, p in module.named_parameters():
        if name.endswith("proj.weight"):
            if zero:
                nn.init.zeros_(p)
            else:
                normal_(p, std=0.02 / math.sqrt(depth))


def init_head(head: nn.Linear, cfg: ModelConfig) -> None:
    """`model.zero_init` starts an untied head at zero (uniform predictions)."""
    if cfg.zero_init and not cfg.tie_weights:
        nn.init.zeros_(head.weight)


class GPT(nn.Module):
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
        if cfg.bigram:  # row prev * V + cur; prev = V: the first position, with none before it
            self.bigram = Embedding((vocab_size + 1) * vocab_size, cfg.n_embd)
        self.apply(init_weights)
        scale_residual_projections(self, 2 * cfg.n_layer, cfg.zero_init)  # attention, MLP
        init_head(self.head, cfg)
        if cfg.bigram:
            nn.init.zeros_(self.bigram.weight)  # learned from nothing, as it is added

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        cfg = self.cfg
        p = self.wte.weight
        return KVCache(cfg.n_layer, batch_size, cfg.n_head, max_len or cfg.block_size,
                       cfg.head_dim, p.device, attention.attention_dtype(p))

    def embed(self, idx: torch.Tensor, pos: torch.Tensor,
              cache: KVCache | None = None) -> torch.Tensor:
        """`embed`, plus with `model.bigram` each (previous, current) pair's vector, the first
        new token's previous being the cache's last."""
        x = embed(self.wte, getattr(self, "wpe", None), self.cfg, idx, pos)
        if not self.cfg.bigram:
            return x
        V = self.vocab_size
        before = (cache.last_ids if cache is not None else idx.new_full((idx.size(0),), V))
        prev = torch.cat([before[:, None], idx[:, :-1]], dim=1)  # (B, T)
        prev = torch.where(pos.expand_as(idx) == 0, V, prev)  # a window's first token: none
        if cache is not None:
            cache.last_ids.copy_(idx[:, -1])  # in place: a view's rows are its cache's
        return x + self.bigram(prev * V + idx)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: KVCache | None = None, cross: Callable[[int], Cross] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) -> logits (B, T, V) and, with targets (B, T), the float32 mean
        cross-entropy over targets not -1 (padding), label-smoothed in training only, so val
        losses stay comparable across runs. With a cache the tokens follow the cached ones, and
        cache.pos advances by T; `cross(layer)`: the encoder-decoder's cross-attention inputs."""
        T = idx.size(1)
        pos = positions(cache, T, self.cfg.block_size, idx.device)
        x = maybe_dropout(self.embed(idx, pos, cache), self.cfg.dropout, self.training)
        rope = rope_tables(self.cfg, pos)
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i, rope, None, None if cross is None else cross(i))
        if cache is not None:
            cache.pos += T
        logits = self.head(self.ln_f(x))  # (B, T, V)
        cap = self.cfg.logit_softcap
        if cap > 0:  # in float32: tanh saturates early in bf16
            logits = (cap * torch.tanh(logits.float() / cap)).to(logits.dtype)
        loss = None
        if targets is not None:
            smoothing = self.cfg.label_smoothing if self.training else 0.0
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                   targets.reshape(-1), ignore_index=-1,
                                   label_smoothing=smoothing)
        return logits, loss


def count_components(model: nn.Module, groups: dict[str, tuple[str, ...]],
                     stacks: dict[str, int | None]) -> dict[str, int]:
    """Parameters per component of `groups` (the first with a key in ".NAME"), each tied tensor
    once, plus the total. `stacks` maps a block list's name to the depth it stands for (None:
    as built): its blocks are all alike, so a model built with fewer stands for a deeper one."""
    counts = dict.fromkeys(groups, 0)
    in_stacks = {(c, stack): 0 for c in groups for stack in stacks}
    for name, p in model.named_parameters():  # yields a tied tensor once, under wte
        component = next(c for c, keys in groups.items() if any(k in f".{name}" for k in keys))
        stack = name.partition(".")[0]
        if stack in stacks:
            in_stacks[component, stack] += p.numel()
        else:
            counts[component] += p.numel()
    for (component, stack), n in in_stacks.items():
        built = len(getattr(model, stack))
        counts[component] += n // built * (built if stacks[stack] is None else stacks[stack])
    counts["total"] = sum(counts.values())
    return counts


def param_counts(model: nn.Module, n_layer: int | None = None) -> dict[str, int]:
    """`count_components` of a GPT or (`EncoderDecoder.component_counts`) an encoder-decoder."""
    if not isinstance(model, GPT):
        return model.component_counts(n_layer)
    groups = {"token_embedding": ("wte.",), "position_embedding": ("wpe.",),
              "bigram": ("bigram.",), "attention": (".attn.",), "mlp": (".mlp.",),
              "norms": ("ln_",), "head": ("head.",)}
    return count_components(model, groups, {"blocks": n_layer})


def parameter_count(cfg: ModelConfig, vocab_size: int) -> int:
    """The parameter count of `GPT(cfg, vocab_size)`, from one block on the meta device, so a
    mistyped `model.n_layer=1000000000` is counted at once."""
    with torch.device("meta"):
        model = GPT(dataclasses.replace(cfg, n_layer=1), vocab_size)
    return param_counts(model, cfg.n_layer)["total"]
