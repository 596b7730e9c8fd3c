"""How much memory a model's batches take, estimated from the config before anything is
allocated, so a mistyped size is refused with one line rather than growing until the kernel kills
the process: on the high side, a guard against sizes that cannot fit, not the last gigabyte."""

from __future__ import annotations

import torch

from charlm.config.schema import ModelConfig

IDS_BYTES = 32  # a position's int64 ids: the sampler's index and window, then x and y
LOGITS_COPIES = 4  # the logits, their float32 copy, the log-softmax kept, and its gradient
TEXT_BYTES = 12  # a scored character: its code point (up to 4 bytes) and its int64 id
WINDOW_BYTES = 100  # a scoring window's (start, offset): a tuple of two ints in a list


def block_bytes(cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                attentions: int = 1) -> int:
    """Bytes a position keeps for the backward in one block of `attentions` attention
    sublayers (a decoder block with cross-attention: 2) and an MLP."""
    C, e = cfg.n_embd, torch.empty((), dtype=dtype).element_size()
    attn_e = 4 if device.type == "cpu" else e  # the CPU attends in float32 (attention.attention)
    hidden = (4 if cfg.activation == "swiglu" else 2) * cfg.ff_width  # fc out, activation
    sublayers = attentions + 1
    kept = sublayers * 4 * C  # each sublayer's norm input: the float32 residual stream
    kept += attentions * (2 * C * e + 4 * C * attn_e)  # q/kv and o inputs; q, k, v, output
    kept += (C + hidden) * e  # the MLP's input and hidden activations
    if cfg.dropout > 0:
        kept += sublayers * 4 * C  # a mask per sublayer
    # SDPA's math path keeps (B, H, T, T) weights: the CPU's with dropout (its flash kernel has
    # none), MPS's always; scores, mask, softmax, dropout: (H, T) each a position
    if device.type == "mps" or (device.type != "cuda" and cfg.dropout > 0):
        kept += attentions * 4 * 4 * cfg.n_head * cfg.block_size
    return kept


def training_bytes(cfg: ModelConfig, vocab_size: int, rows: int, dtype: torch.dtype,
                   device: torch.device) -> int:
    """What a training micro-batch of `rows` x block_size keeps for its backward; weights,
    gradients and optimizer state come on top (16 bytes a parameter)."""
    per_position = (cfg.n_layer * block_bytes(cfg, dtype, device,
                                              2 if cfg.arch == "encoder_decoder" else 1)
                    + LOGITS_COPIES * 4 * vocab_size + 2 * 4 * cfg.n_embd + IDS_BYTES)
    if cfg.arch == "encoder_decoder":  # the source's positions: its stack, embedding, memory
        per_position += (cfg.encoder_layers * block_bytes(cfg, dtype, device)
                         + 3 * 4 * cfg.n_embd + IDS_BYTES)
    return rows * cfg.block_size * per_position


def forward_bytes(cfg: ModelConfig, vocab_size: int, rows: int, seq_len: int | None = None
                  ) -> int:
    """A no-grad forward's float32 peak over `rows` x seq_len: a layer's temporaries, logits x3."""
    T = cfg.block_size if seq_len is None else seq_len
    per_position = 4 * cfg.ff_width + 3 * vocab_size + 8 * cfg.n_embd + cfg.n_head * T
    return 4 * rows * T * per_position


def sampling_bytes(cfg: ModelConfig, vocab_size: int, rows: int, element_size: int) -> int:
    """Generating `rows` samples (or beams) at once: the KV cache (an encoder-decoder's twice,
    for its sources' cross-attention keys and values) and one forward over the context."""
    caches = 2 if cfg.arch == "encoder_decoder" else 1
    return caches * cache_bytes(cfg, rows, element_size) + forward_bytes(cfg, vocab_size, rows)


def cache_bytes(cfg: ModelConfig, rows: int, element_size: int) -> int:
    """A KV cache of `rows` rows over the whole context: keys and values for every layer."""
    return 2 * cfg.n_layer * rows * cfg.block_size * cfg.n_embd * element_size


def scoring_bytes(cfg: ModelConfig, vocab_size: int, chars: int, windows: int,
                  rows: int) -> int:
    """Scoring `chars` characters: the text, its plan of `windows` and one forward of `rows`."""
    seq_len = max(1, min(cfg.block_size, chars - 1))
    return (TEXT_BYTES * chars + WINDOW_BYTES * windows
            + forward_bytes(cfg, vocab_size, rows, seq_len))
