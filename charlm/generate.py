"""Generation: `prefill`, `decode_step`, logits processors, and `generate`, an iterator that
streams one id per sample per step.

Past the context window (cached path): when the cache is full, the last `block_size // 2` tokens
are kept and re-prefilled in one forward, so the cost per new token stays O(1) forward passes
amortised and memory stays bounded. Up to the first full window the tokens are identical to the
uncached path, which crops the context to its last `block_size` tokens at every step.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from charlm.model import GPT, KVCache


def prefill(model: GPT, cache: KVCache, idx: torch.Tensor) -> torch.Tensor:
    """Run the prompt idx (B, T) through the model in one forward; logits (B, V) of its last
    position."""
    logits, _ = model(idx, cache=cache)
    return logits[:, -1, :]


def decode_step(model: GPT, cache: KVCache, ids: torch.Tensor) -> torch.Tensor:
    """Feed one new token per sample, ids (B,); logits (B, V) for the next one."""
    logits, _ = model(ids[:, None], cache=cache)
    return logits[:, -1, :]


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the k largest logits of each row, set the rest to -inf."""
    if top_k >= logits.size(-1):
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick the next id per row of logits (B, V): argmax for temperature 0, else a draw from
    softmax(top_k(logits / temperature))."""
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = apply_top_k(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.inference_mode()
def generate(model: GPT, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True) -> Iterator[torch.Tensor]:
    """Yield max_new_tokens tensors of ids (B,), one per step, continuing prompt (B, T0).

    A prompt longer than block_size is cropped to its last block_size tokens.
    """
    model.eval()
    block = model.cfg.block_size
    context = prompt[:, -block:]
    if not use_cache:
        for _ in range(max_new_tokens):
            logits, _ = model(context)
            nxt = sample_next(logits[:, -1, :], temperature, top_k, generator)
            yield nxt
            context = torch.cat([context, nxt[:, None]], dim=1)[:, -block:]
        return

    B, T0 = context.shape
    cache = model.new_cache(B)
    window = torch.empty(B, block, dtype=torch.long, device=prompt.device)  # ids in the cache
    window[:, :T0] = context
    logits = prefill(model, cache, context)
    keep = max(block // 2, 1)
    for _ in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, generator)
        yield nxt
        if cache.pos == block:  # full: keep the most recent tokens and re-prefill once
            tail = torch.cat([window[:, block - keep + 1:], nxt[:, None]], dim=1)  # (B, keep)
            window[:, :keep] = tail
            cache.reset()
            logits = prefill(model, cache, tail)
        else:
            window[:, cache.pos] = nxt
            logits = decode_step(model, cache, nxt)
