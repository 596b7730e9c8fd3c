"""The decoder-only GPT, its blocks, and the attention that reads and writes a `KVCache`.

Shapes: B batch, T time (new tokens this forward), C n_embd, H n_head, D head_dim = C // H,
V vocab size. No optimizer and no sampling policy live here.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from charlm.config import ModelConfig


class KVCache:
    """Preallocated keys and values for every layer, and one write position.

    A plain object (not a module or buffer), so it never lands in a `state_dict`. `pos` is the
    number of positions already written; `GPT.forward` advances it once per call.
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


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # fused q, k, v
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, H, T, D)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            start, end = cache.pos, cache.pos + T
            cache.k[layer][:, :, start:end] = k
            cache.v[layer][:, :, start:end] = v
            k, v = cache.k[layer][:, :, :end], cache.v[layer][:, :, :end]  # (B, H, end, D)
            if T == 1:  # one new query sees every cached position
                mask, causal = None, False
            elif start == 0:  # prefill from empty: the ordinary causal mask
                mask, causal = None, True
            else:  # T queries at positions start..end-1 over keys 0..end-1
                rows = torch.arange(start, end, device=x.device)[:, None]
                mask, causal = torch.arange(end, device=x.device)[None, :] <= rows, False
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                               is_causal=causal)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, H, T, D) -> (B, T, C)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.ff_width, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ff_width, cfg.n_embd, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.wte = nn.Embedding(vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.head = nn.Linear(cfg.n_embd, vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2: scale the residual output projections by 1/sqrt(2 * n_layer).
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        cfg = self.cfg
        p = self.wte.weight
        return KVCache(cfg.n_layer, batch_size, cfg.n_head, max_len or cfg.block_size,
                       cfg.n_embd // cfg.n_head, p.device, p.dtype)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) -> logits (B, T, V) and, with targets (B, T), the mean cross-entropy.

        With a cache, the T tokens sit at positions cache.pos .. cache.pos + T - 1, attend to
        everything cached before them, and the cache position advances by T.
        """
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.cfg.block_size:
            raise ValueError(
                f"sequence of {start + T} positions exceeds block_size {self.cfg.block_size}"
            )
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, cache, i)
        if cache is not None:
            cache.pos += T
        logits = self.head(self.ln_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(),
                                   targets.reshape(-1))
        return logits, loss


def param_counts(model: GPT) -> dict[str, int]:
    """Parameters per component, each shared (tied) tensor counted once, plus the total."""
    groups = {"token_embedding": "wte.", "position_embedding": "wpe.", "attention": ".attn.",
              "mlp": ".mlp.", "norms": "ln_", "head": "head."}
    counts = dict.fromkeys(groups, 0)
    for name, p in model.named_parameters():  # yields a tied tensor once, under wte
        component = next(c for c, key in groups.items() if key in f".{name}")
        counts[component] += p.numel()
    counts["total"] = sum(counts.values())
    return counts
