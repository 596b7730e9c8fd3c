"""The encoder-decoder Transformer (Vaswani et al. 2017) over paired text, and its decoding.

`EncoderDecoder` is built from `charlm.model.gpt`'s pieces, never copies: the encoder is a stack
of `Block(cfg, causal=False)` over the source, the decoder a stack of
`Block(cfg, causal=True, cross=True)` whose cross-attention reads the encoder's output. Every
`ModelConfig` option applies to both stacks; rotary positions turn only self-attention.

Decoding: `encode` runs the encoder and every decoder layer's cross-attention key and value
projections once per source (`EncoderOutput`); `Seq2SeqDecoder` then feeds target ids through the
decoder with the same prefill / step / reorder interface as `generate`'s decoders, so
`translate_ids` (greedy or sampled, batched) and `beam_search_ids` (`generate.search_beams`)
reuse the logits processors and the one beam search.

Target ids follow `charlm.data.pairs.PairVocab`: units 0..N-1, then pad, bos and eos
(`charlm.data.pairs.target_specials`).

Shapes: B batch, S source length, T target length (new tokens this forward), C n_embd,
H n_head, D head_dim, L decoder layers.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from charlm.config.schema import ModelConfig
from charlm.data.pairs import target_specials
from charlm.model.attention import KVCache, attention_dtype, rope_angles
from charlm.model.gpt import (
    Block,
    embed,
    init_head,
    init_weights,
    logits_and_loss,
    make_norm,
    positions,
    scale_residual_projections,
)
from charlm.model.layers import Embedding, Linear, maybe_dropout


def key_mask(mask: torch.Tensor) -> torch.Tensor:
    """The attention mask (B, 1, 1, S) of real source positions mask (B, S). A source with no
    real position attends to its padding instead: its rows stay finite (softmax over nothing is
    NaN) and cannot poison a batch's loss."""
    return (mask | ~mask.any(dim=-1, keepdim=True))[:, None, None, :]


class EncoderOutput:
    """The encoder's output for a batch of sources, reused at every decode step and by every
    beam: out (B, S, C), mask (B, S) (True = a real source position), and per decoder layer the
    cross-attention's keys and values (B, H, S, D), projected once per source."""

    def __init__(self, out: torch.Tensor, mask: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor]):
        self.out = out
        self.mask = mask
        self.keys = keys
        self.values = values
        self.key_mask = key_mask(mask)  # (B, 1, 1, S), built once rather than per step

    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What decoder block `layer` attends to: (k, v, mask), as `Block.forward` takes it."""
        return self.keys[layer], self.values[layer], self.key_mask

    def select(self, index: torch.Tensor) -> EncoderOutput:
        """Rows index (B',) of this memory, in that order (beams, dropping finished rows). The
        tensors are copies: nothing here changes when the new memory does."""
        return EncoderOutput(self.out[index], self.mask[index], [k[index] for k in self.keys],
                      [v[index] for v in self.values])


class EncoderDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig, source_vocab_size: int, target_vocab_size: int,
                 source_pad: int):
        super().__init__()
        if not 0 <= source_pad < source_vocab_size:
            raise ValueError(f"source_pad {source_pad} is not a source id "
                             f"(0..{source_vocab_size - 1})")
        self.cfg = cfg
        self.source_vocab_size = source_vocab_size
        self.target_vocab_size = target_vocab_size
        self.source_pad = source_pad
        learned = cfg.pos_encoding == "learned"  # the only scheme with a position table
        post = cfg.norm_placement == "post"  # post-norm blocks end in a norm: no final one
        self.src_wte = Embedding(source_vocab_size, cfg.n_embd)
        if learned:
            self.src_wpe = Embedding(cfg.block_size, cfg.n_embd)
        self.encoder = nn.ModuleList(Block(cfg, causal=False)
                                     for _ in range(cfg.encoder_layers))
        self.ln_enc = nn.Identity() if post else make_norm(cfg)
        self.wte = Embedding(target_vocab_size, cfg.n_embd)
        if learned:
            self.wpe = Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, causal=True, cross=True)
                                    for _ in range(cfg.n_layer))
        self.ln_f = nn.Identity() if post else make_norm(cfg)
        self.head = Linear(cfg.n_embd, target_vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.wte.weight
        self.apply(init_weights)
        # GPT-2's residual scaling, per stack: an encoder block adds two sublayers into the
        # stream, a decoder block three (self-attention, cross-attention, MLP).
        scale_residual_projections(self.encoder, 2 * cfg.encoder_layers, cfg.zero_init)
        scale_residual_projections(self.blocks, 3 * cfg.n_layer, cfg.zero_init)
        init_head(self.head, cfg)

    @property
    def pad(self) -> int:
        return target_specials(self.target_vocab_size)[0]

    @property
    def bos(self) -> int:
        return target_specials(self.target_vocab_size)[1]

    @property
    def eos(self) -> int:
        return target_specials(self.target_vocab_size)[2]

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        """A cache for the decoder's self-attention (the source's keys are in `EncoderOutput`)."""
        cfg, p = self.cfg, self.wte.weight
        return KVCache(cfg.n_layer, batch_size, cfg.n_head, max_len or cfg.block_size,
                       cfg.head_dim, p.device, attention_dtype(p))

    def _rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        return rope_angles(pos, self.cfg.head_dim) if self.cfg.pos_encoding == "rope" else None

    def encode(self, src: torch.Tensor) -> EncoderOutput:
        """src (B, S), padded with source_pad at the end -> the `EncoderOutput` of the batch."""
        mask = src != self.source_pad  # (B, S)
        pos = positions(None, src.size(1), self.cfg.block_size, src.device)
        x = embed(self.src_wte, getattr(self, "src_wpe", None), self.cfg, src, pos)
        x = maybe_dropout(x, self.cfg.dropout, self.training)  # (B, S, C)
        rope, keys = self._rope(pos), key_mask(mask)
        for i, block in enumerate(self.encoder):
            x = block(x, None, i, rope, keys)  # bidirectional: padding is all it masks
        out = self.ln_enc(x)
        kv = [block.cross_attn.keys_values(out) for block in self.blocks]
        return EncoderOutput(out, mask, [k for k, _ in kv], [v for _, v in kv])

    def forward(self, src: torch.Tensor | None, tgt_in: torch.Tensor,
                targets: torch.Tensor | None = None, cache: KVCache | None = None,
                memory: EncoderOutput | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tgt_in (B, T) (bos, then the target; padded) over the source src (B, S), or over its
        `memory` when given (src is then not read) -> logits (B, T, V) and, with targets
        (B, T), the mean cross-entropy over the positions whose target is not -1.

        With a cache, as `GPT.forward`: the T tokens follow the cached ones and cache.pos
        advances by T.
        """
        if memory is None:
            memory = self.encode(src)
        T = tgt_in.size(1)
        pos = positions(cache, T, self.cfg.block_size, tgt_in.device)
        x = embed(self.wte, getattr(self, "wpe", None), self.cfg, tgt_in, pos)
        x = maybe_dropout(x, self.cfg.dropout, self.training)  # (B, T, C)
        rope = self._rope(pos)
        for i, block in enumerate(self.blocks):  # causal: padding after a target is never seen
            x = block(x, cache, i, rope, None, memory.cross(i))
        if cache is not None:
            cache.pos += T
        return logits_and_loss(self, x, targets)

    def component_counts(self, n_layer: int | None = None,
                         n_encoder_layer: int | None = None) -> dict[str, int]:
        """Parameters per component (`model.param_counts`), each tied tensor once. n_layer and
        n_encoder_layer (default: the model's) let a model built with fewer blocks stand for a
        deeper one: each stack's blocks are all alike."""
        groups = {"embeddings": ("src_wte.", "src_wpe.", "wte.", "wpe."),
                  "encoder": ("encoder.", "ln_enc."), "decoder_self_attention": (".attn.",),
                  "cross_attention": (".cross_attn.",), "decoder_mlp": (".mlp.",),
                  "decoder_norms": (".ln_", "ln_f."), "head": ("head.",)}
        layers = {"encoder": (n_encoder_layer or len(self.encoder), len(self.encoder)),
                  "blocks": (n_layer or len(self.blocks), len(self.blocks))}
        counts = dict.fromkeys(groups, 0)
        in_stacks = {(c, stack): 0 for c in groups for stack in layers}
        for name, p in self.named_parameters():  # yields a tied tensor once, under wte
            component = next(c for c, keys in groups.items()
                             if any(name.startswith(k) or k in f".{name}" for k in keys))
            stack = name.partition(".")[0]
            if stack in layers:
                in_stacks[component, stack] += p.numel()
            else:
                counts[component] += p.numel()
        for (component, stack), n in in_stacks.items():
            wanted, built = layers[stack]
            counts[component] += n // built * wanted
        counts["total"] = sum(counts.values())
        return counts


def parameter_count(cfg: ModelConfig, source_vocab_size: int, target_vocab_size: int) -> int:
    """The parameter count of an `EncoderDecoder` without building its blocks: one block per
    stack on the meta device stands for them (as `model.parameter_count` does for the GPT)."""
    with torch.device("meta"):
        model = EncoderDecoder(dataclasses.replace(cfg, n_layer=1, n_encoder_layer=1),
                               source_vocab_size, target_vocab_size, source_vocab_size - 1)
    return model.component_counts(cfg.n_layer, cfg.encoder_layers)["total"]


def output_limit(source_len: int, block_size: int, cap: int | None = None) -> int:
    """The longest output decoded for a source of source_len: room in the target window (bos
    takes one position), and 2 * source_len + 10, generous for transliteration-like pairs
    while a model that never says eos stops early."""
    limit = min(block_size - 1, 2 * source_len + 10)
    return limit if cap is None else min(limit, cap)


