"""Attention: SDPA in each device's dtype, the `KVCache`, rotary positions, and the self- and
cross-attention sublayers of `charlm.model.gpt.Block` (shapes: `charlm.model`'s)."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.config.schema import ModelConfig
from charlm.model.layers import Linear, maybe_dropout


def attention_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 on the CPU, whose bf16/fp16 flash kernel is slower than its float32 one, else
    x's dtype. A KV cache is kept in it, so a decode step converts only the new q, k and v."""
    return torch.float32 if x.is_cpu else x.dtype


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              causal: bool, dropout: float) -> torch.Tensor:
    """SDPA of q (B, H, T, D) over k, v (B, H, S, D), computed in `attention_dtype`."""
    dtype = attention_dtype(q)
    if dtype is not q.dtype:
        with torch.autocast("cpu", enabled=False):  # CPU autocast would cast back to bf16
            y = F.scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask,
                                               dropout, causal)
        return y.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, mask, dropout, causal)


class KVCache:
    """Preallocated keys and values for every layer: a plain object, never in a `state_dict`.
    `pos`, the positions written, advances once per `GPT.forward`. As a device tensor, 0-d or
    (B,) (a position a row: `charlm serve`), a forward takes one token a row and attends over the
    whole cache with later positions masked: static shapes, one compiled graph."""

    def __init__(self, n_layer: int, batch_size: int, n_head: int, max_len: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype):
        shape = (batch_size, n_head, max_len, head_dim)  # (B, H, L, D)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.max_len = max_len
        self.pos = 0
        # each row's latest token, the previous of its next (`model.bigram`)
        self.last_ids = torch.zeros(batch_size, dtype=torch.long, device=device)

    def reset(self) -> None:
        self.pos = 0

    def view(self, rows: slice, length: int | None = None) -> KVCache:
        """Rows `rows` as a cache over the same storage (a per-row `pos` narrowed too); `length`
        (with a tensor `pos`) makes a step attend over the first `length` positions only."""
        part = copy.copy(self)
        part.k = [k[rows] for k in self.k]  # whole rows: contiguous, as attend writes them
        part.v = [v[rows] for v in self.v]
        part.last_ids = self.last_ids[rows]
        part.max_len = length or self.max_len
        if isinstance(self.pos, torch.Tensor) and self.pos.dim() == 1:
            part.pos = self.pos[rows]
        return part

    def copy_row(self, src: int, dst: int) -> None:
        """Row src's keys and values copied to row dst (a request moving slot)."""
        for k, v in zip(self.k, self.v, strict=True):
            k[dst] = k[src]
            v[dst] = v[src]
        self.last_ids[dst] = self.last_ids[src]


def rope_angles(pos: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables (Su et al. 2021) for positions pos (T,): cos = [cos a, cos a] and
    sin = [-sin a, sin a], each (T, D), a_i = p * 10000^(-2i/D); pos (B, T): (B, 1, T, D)."""
    inv_freq = 10000.0 ** -(torch.arange(0, head_dim, 2, device=pos.device).float() / head_dim)
    angles = pos.float()[..., None] * inv_freq  # (T, D/2) or (B, T, D/2)
    if pos.dim() == 2:
        angles = angles.unsqueeze(1)  # (B, 1, T, D/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate feature pairs (i, i + D/2) of x (..., T, D) by position (GPT-NeoX's "rotate
    half"), so q.k depends only on m - n: x * cos + [x2, x1] * sin, the roll swapping halves."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + x.roll(x.size(-1) // 2, dims=-1) * sin


class SelfAttention(nn.Module):
    """Causal (the GPT, the decoder) or bidirectional (the encoder) self-attention."""

    def __init__(self, cfg: ModelConfig, causal: bool = True):
        super().__init__()
        self.n_head = cfg.n_head
        self.causal = causal
        self.qkv = Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # fused q, k, v
        self.proj = Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.qk_norm = cfg.qk_norm

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). With a cache (causal only) the new keys and values are
        written at cache.pos and the queries see everything cached up to them; without one,
        `mask` (B, 1, 1, T), True = attend (the encoder's padding), and `causal` apply."""
        B, T, C = x.shape
        H, causal = self.n_head, self.causal
        dropout = self.dropout if self.training else 0.0
        # (B, T, 3C) -> 3 x (B, H, T, D) in two view ops
        qkv = self.qkv(x).view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        if self.qk_norm:  # q and k in one go; v as it was
            qkv = torch.cat([unit_rms(qkv[:2]), qkv[2:]])
        if rope is not None:  # rotate before caching: cached keys keep their absolute positions
            (q, k), v = apply_rope(qkv[:2], *rope), qkv[2]  # q and k in one go
        else:
            q, k, v = qkv.unbind(0)
        if cache is not None:
            cache_k, cache_v = cache.k[layer], cache.v[layer]  # (B, H, L, D)
        if cache is not None and isinstance(cache.pos, torch.Tensor):  # one token a row at pos
            at = cache.pos.expand(B)  # (B,): shared (0-d) or each row's own position
            # each (row, head)'s slot in the cache seen as (B * H * L, D) rows: index_copy_ on
            # it stays in place in a compiled graph (a scatter_ there copies the whole cache)
            L, D = cache_k.size(2), C // H
            heads = torch.arange(B * H, device=x.device).view(B, H)
            index = (heads * L + at[:, None]).view(-1)  # (B * H,)
            cache_k.view(-1, D).index_copy_(0, index, k.reshape(-1, D).to(cache_k.dtype))
            cache_v.view(-1, D).index_copy_(0, index, v.reshape(-1, D).to(cache_v.dtype))
            S = cache.max_len  # the positions attended over: L, or fewer (`KVCache.view`)
            keys = torch.arange(S, device=x.device)
            mask, causal = (keys[None, :] <= at[:, None]).view(B, 1, 1, S), False
            k, v = cache_k.narrow(2, 0, S), cache_v.narrow(2, 0, S)
        elif cache is not None:
            start, end = cache.pos, cache.pos + T
            cache_k.narrow(2, start, T).copy_(k)
            cache_v.narrow(2, start, T).copy_(v)
            k, v = cache_k.narrow(2, 0, end), cache_v.narrow(2, 0, end)  # (B, H, end, D)
            if T == 1:  # one new query sees every cached position
                mask, causal = None, False
            elif start == 0:  # prefill from empty: the ordinary causal mask
                mask, causal = None, True
            else:  # T queries at positions start..end-1 over keys 0..end-1
                rows = torch.arange(start, end, device=x.device)[:, None]
                mask, causal = torch.arange(end, device=x.device)[None, :] <= rows, False
        y = attention(q, k, v, mask, causal, dropout)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(B, T, C)
        return maybe_dropout(self.proj(y), self.dropout, self.training)


def unit_rms(x: torch.Tensor) -> torch.Tensor:
    """x (..., D) scaled to a root mean square of 1 over D, in float32 (QK-norm, `RMSNorm`)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + 1e-5)).type_as(x)


class CrossAttention(nn.Module):
    """The decoder's attention over the encoder's output, whose keys and values `keys_values`
    projects once per source. No rotary positions: target and source share no axis."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.q = Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.kv = Linear(cfg.n_embd, 2 * cfg.n_embd, bias=cfg.bias)  # fused k, v
        self.proj = Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.qk_norm = cfg.qk_norm

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's output memory (B, S, C) -> k, v, each (B, H, S, D)."""
        B, S, C = memory.shape
        kv = self.kv(memory).view(B, S, 2, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        k, v = kv.to(attention_dtype(kv)).unbind(0)  # converted once per source
        return (unit_rms(k) if self.qk_norm else k), v

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """x (B, T, C) over `keys_values`' k, v; mask (B, 1, 1, S), True = a real position."""
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, H, T, D)
        q = unit_rms(q) if self.qk_norm else q
        y = attention(q, k, v, mask, False, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)
        return maybe_dropout(self.proj(y), self.dropout, self.training)
