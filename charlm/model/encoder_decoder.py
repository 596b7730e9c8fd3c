"""The encoder-decoder Transformer (Vaswani et al. 2017) over paired text, built of
`charlm.model.gpt`'s `Block`s: an encoder stack (causal=False) over the source, a decoder stack
(cross=True) over its output. `encode` runs once per source; `charlm.generation.seq2seq`
decodes. Target ids are `PairVocab`'s (`charlm.data.pairs.target_specials`)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from charlm.config.schema import ModelConfig
from charlm.data.pairs import target_specials
from charlm.model import gpt
from charlm.model.attention import KVCache
from charlm.model.layers import Embedding, Linear, maybe_dropout


def key_mask(mask: torch.Tensor) -> torch.Tensor:
    """The attention mask (B, 1, 1, S) of real source positions mask (B, S). A source with none
    attends to its padding instead, so its rows stay finite (softmax over nothing is NaN)."""
    return (mask | ~mask.any(dim=-1, keepdim=True))[:, None, None, :]


class EncoderOutput:
    """The encoder's output for a batch of sources, reused by every decode step and beam: out
    (B, S, C), mask (B, S), each decoder layer's cross-attention keys and values."""

    def __init__(self, out: torch.Tensor, mask: torch.Tensor, keys: list[torch.Tensor],
                 values: list[torch.Tensor]):
        self.out = out
        self.mask = mask
        self.keys = keys
        self.values = values
        self.key_mask = key_mask(mask)  # (B, 1, 1, S), built once rather than per step

    def cross(self, layer: int) -> gpt.Cross:
        """Decoder block `layer`'s (k, v, mask), as `Block.forward` takes it."""
        return self.keys[layer], self.values[layer], self.key_mask

    def select(self, index: torch.Tensor) -> EncoderOutput:
        """Rows index (B',) in that order (beams, dropping finished rows), as copies."""
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
        self.pad, self.bos, self.eos = target_specials(target_vocab_size)
        learned = cfg.pos_encoding == "learned"  # the only scheme with a position table
        post = cfg.norm_placement == "post"  # post-norm blocks end in a norm: no final one
        self.src_wte = Embedding(source_vocab_size, cfg.n_embd)
        if learned:
            self.src_wpe = Embedding(cfg.block_size, cfg.n_embd)
        self.encoder = nn.ModuleList(gpt.Block(cfg, causal=False)
                                     for _ in range(cfg.encoder_layers))
        self.ln_enc = nn.Identity() if post else gpt.make_norm(cfg)
        self.wte = Embedding(target_vocab_size, cfg.n_embd)
        if learned:
            self.wpe = Embedding(cfg.block_size, cfg.n_embd)
        self.blocks = nn.ModuleList(gpt.Block(cfg, causal=True, cross=True)
                                    for _ in range(cfg.n_layer))
        self.ln_f = nn.Identity() if post else gpt.make_norm(cfg)
        self.head = Linear(cfg.n_embd, target_vocab_size, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.wte.weight
        self.apply(gpt.init_weights)
        # per stack: an encoder block adds 2 sublayers to the stream, a decoder block 3 (+ cross)
        gpt.scale_residual_projections(self.encoder, 2 * cfg.encoder_layers, cfg.zero_init)
        gpt.scale_residual_projections(self.blocks, 3 * cfg.n_layer, cfg.zero_init)
        gpt.init_head(self.head, cfg)

    new_cache = gpt.GPT.new_cache  # the decoder's self-attention (the source's: `EncoderOutput`)
    embed = gpt.GPT.embed  # the target's (model.bigram is refused for encoder_decoder)

    def encode(self, src: torch.Tensor) -> EncoderOutput:
        """src (B, S), padded with source_pad at the end -> its `EncoderOutput`."""
        mask = src != self.source_pad  # (B, S)
        pos = gpt.positions(None, src.size(1), self.cfg.block_size, src.device)
        x = gpt.embed(self.src_wte, getattr(self, "src_wpe", None), self.cfg, src, pos)
        x = maybe_dropout(x, self.cfg.dropout, self.training)  # (B, S, C)
        rope, keys = gpt.rope_tables(self.cfg, pos), key_mask(mask)
        for i, block in enumerate(self.encoder):
            x = block(x, None, i, rope, keys)  # bidirectional: padding is all it masks
        out = self.ln_enc(x)
        kv = [block.cross_attn.keys_values(out) for block in self.blocks]
        return EncoderOutput(out, mask, [k for k, _ in kv], [v for _, v in kv])

    def forward(self, src: torch.Tensor | None, tgt_in: torch.Tensor,
                targets: torch.Tensor | None = None, cache: KVCache | None = None,
                memory: EncoderOutput | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`GPT.forward` of tgt_in (B, T) (bos, then the target) over src, or its `memory`;
        causal, so the padding after a target is never seen."""
        memory = self.encode(src) if memory is None else memory
        return gpt.GPT.forward(self, tgt_in, targets, cache, memory.cross)

    def component_counts(self, n_layer: int | None = None,
                         n_encoder_layer: int | None = None) -> dict[str, int]:
        """`count_components` per stack (the depths default to the model's)."""
        groups = {"embeddings": ("src_wte.", "src_wpe.", "wte.", "wpe."),
                  "encoder": ("encoder.", "ln_enc."), "decoder_self_attention": (".attn.",),
                  "cross_attention": (".cross_attn.",), "decoder_mlp": (".mlp.",),
                  "decoder_norms": (".ln_", "ln_f."), "head": ("head.",)}
        return gpt.count_components(self, groups, {"encoder": n_encoder_layer or None,
                                                   "blocks": n_layer or None})


def parameter_count(cfg: ModelConfig, source_vocab_size: int, target_vocab_size: int) -> int:
    """The parameter count of an `EncoderDecoder`, from one block per stack on the meta device."""
    with torch.device("meta"):
        model = EncoderDecoder(dataclasses.replace(cfg, n_layer=1, n_encoder_layer=1),
                               source_vocab_size, target_vocab_size, source_vocab_size - 1)
    return model.component_counts(cfg.n_layer, cfg.encoder_layers)["total"]


def output_limit(source_len: int, block_size: int, cap: int | None = None) -> int:
    """The longest output for a source: what the target window holds after bos, and a margin
    generous for transliteration yet early for a model that never says eos."""
    limit = min(block_size - 1, 2 * source_len + 10)
    return limit if cap is None else min(limit, cap)


