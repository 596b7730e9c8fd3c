"""What differs between training a GPT on text and an encoder-decoder on pairs: the data, its
batches, the model, the vocabulary a checkpoint stores, and what an eval shows besides the loss.
`task_for` picks one by the run's data; training, evaluation and loading ask it."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from charlm.config.schema import RunConfig
from charlm.core.errors import CharlmError
from charlm.data.batches import BatchSampler, PairBatchSampler, require_window
from charlm.data.dataset_dir import Dataset, PairDataset
from charlm.data.datasets import prepared_data, prepared_dir
from charlm.data.pairs import PairVocab, references
from charlm.data.vocab import Vocab
from charlm.evaluation.pairs import output_accuracy, rate_name
from charlm.generation.text import preview
from charlm.model import encoder_decoder, gpt


class TextTask:
    """A decoder-only GPT on a character stream: random windows of block_size + 1."""

    def __init__(self, cfg: RunConfig, data: Dataset):
        self.cfg, self.data, self.vocab = cfg, data, data.vocab
        for split in ("train", "val"):
            require_window(data.split(split), cfg.model.block_size, split, cfg.data.shown,
                           prepared_dir(cfg.data) is not None)

    def vocab_state(self) -> Any:
        return self.vocab.state()

    def sampler(self, split: str, seed: int, device: torch.device, rows: slice) -> BatchSampler:
        return BatchSampler(self.data.split(split), self.cfg.model.block_size,
                            self.cfg.train.batch_size, device, seed, name=split, rows=rows)

    def parameter_count(self) -> int:
        return gpt.parameter_count(self.cfg.model, len(self.vocab))

    def example_batch(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Zeros shaped like a training batch, for `compile_model`."""
        shape = (rows, self.cfg.model.block_size)
        return tuple(torch.zeros(shape, dtype=torch.long, device=device) for _ in "xy")

    def random_batch(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Random ids shaped like a training batch, for `sizing` to time."""
        x = torch.randint(len(self.vocab), (rows, self.cfg.model.block_size), device=device)
        return x, x

    def train_tokens(self) -> int:
        return len(self.data.split("train"))

    def room(self) -> int:
        """The longest block the data's splits leave a window for."""
        return min(len(self.data.split(name)) for name in ("train", "val")) - 1

    def eval_report(self, model: torch.nn.Module, stop: Callable[[], bool] | None = None
                    ) -> tuple[dict[str, float], str, str | None]:
        """What an eval logs besides the losses: metrics, their text for the eval's line, and
        a sample (None: none), cut short once stop() says so."""
        tc = self.cfg.train
        return {}, "", (preview(model, self.vocab, tc.sample_chars, tc.seed, stop)
                        if tc.sample_chars else None)


class PairsTask:
    """An encoder-decoder on (source, target) pairs: length-bucketed padded batches."""

    def __init__(self, cfg: RunConfig, data: PairDataset):
        self.cfg, self.data, self.vocab = cfg, data, data.vocab
        block = cfg.model.block_size
        splits = [data.split(name) for name in ("train", "val", "test")]
        self.longest = [max((int(np.diff(o).max()) for o in offsets if len(o) > 1), default=0)
                        for offsets in ([s.src_offsets for s in splits],
                                        [s.tgt_offsets for s in splits])]
        if self.room() > block:
            raise CharlmError(
                f"{cfg.data.shown} holds sources of up to {self.longest[0]} characters and "
                f"targets of up to {self.longest[1]} units, but model.block_size {block} fits "
                f"sources of {block} and targets of {block - 1}; raise model.block_size")

    def vocab_state(self) -> Any:
        return self.vocab.to_dict()

    def sampler(self, split: str, seed: int, device: torch.device, rows: slice
                ) -> PairBatchSampler:
        return PairBatchSampler(self.data.split(split), self.vocab, self.cfg.train.batch_size,
                                device, seed, rows=rows)

    def parameter_count(self) -> int:
        return encoder_decoder.parameter_count(self.cfg.model, self.vocab.source_size,
                                               self.vocab.target_size)

    def example_batch(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        src = torch.zeros((rows, self.cfg.model.block_size), dtype=torch.long, device=device)
        return src, src.clone(), src.clone()

    def random_batch(self, rows: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """Random ids shaped like a typical training batch: sources and targets (after the
        begin id) of the training split's mean lengths."""
        train = self.data.train
        S, T = (max(1, round(float(np.diff(o).mean()))) if len(o) > 1 else 1
                for o in (train.src_offsets, train.tgt_offsets))
        src = torch.randint(self.vocab.source_size, (rows, S), device=device)
        tgt = torch.randint(self.vocab.target_size, (rows, T + 1), device=device)
        return src, tgt, tgt

    def train_tokens(self) -> int:
        """The training split's source and target ids (and begin ids), as `random_batch` counts."""
        train = self.data.train
        return len(train.src) + len(train.tgt) + len(train)

    def room(self) -> int:
        """The block the longest pair needs: its source, or its target after the begin id."""
        return max(self.longest[0], self.longest[1] + 1, 1)

    def eval_report(self, model: torch.nn.Module, stop: Callable[[], bool] | None = None
                    ) -> tuple[dict[str, float], str, str | None]:
        """Exact match and CER of the greedy outputs for the first train.eval_pairs val
        sources, and a few of them as the sample. `stop` is not asked: the metrics need all."""
        n = self.cfg.train.eval_pairs
        if not n:
            return {}, "", None
        refs = references(self.data.val, self.vocab)[:n]
        was_training = model.training
        try:
            acc, hyps = output_accuracy(model, self.vocab, refs)
        finally:
            model.train(was_training)
        shown = "\n".join(f"{s} -> {h}  (ref: {' | '.join(r)})"
                          for (s, r), h in zip(refs[:5], hyps, strict=False))
        note = (f", exact match {acc.exact_match:.1%}, {rate_name(self.vocab)} {acc.cer:.2%} "
                f"({len(refs)} val sources)")
        return {"val_exact_match": acc.exact_match, "val_cer": acc.cer}, note, shown


Task = TextTask | PairsTask


def task_for(cfg: RunConfig, cache_dir: Path,
             check: Callable[[Any], None] | None = None,
             base: Vocab | PairVocab | None = None) -> Task:
    """The run's task over its data, prepared into `cache_dir` if need be (`prepared_data`)."""
    data = prepared_data(cfg, cache_dir, check, base)
    return PairsTask(cfg, data) if isinstance(data, PairDataset) else TextTask(cfg, data)


def vocab_from_state(state: Any) -> Vocab | PairVocab:
    """The vocabulary a checkpoint stores: a GPT's `Vocab.state()` or a PairVocab's dict."""
    if isinstance(state, dict) and "units" not in state:
        return PairVocab.from_dict(state)
    return Vocab.from_state(state)


def build_model(cfg: RunConfig, vocab: Vocab | PairVocab) -> torch.nn.Module:
    """An untrained model of the config's architecture for this vocabulary."""
    if isinstance(vocab, PairVocab) != (cfg.model.arch == "encoder_decoder"):
        raise ValueError(f"model.arch {cfg.model.arch} does not match the stored vocabulary")
    if isinstance(vocab, PairVocab):
        return encoder_decoder.EncoderDecoder(cfg.model, vocab.source_size, vocab.target_size,
                                              vocab.src_pad)
    return gpt.GPT(cfg.model, len(vocab))


def check_weights(stored: Mapping[str, Any]) -> None:
    """Raise ValueError unless every stored weight is a floating-point tensor of finite numbers:
    `load_state_dict` would cast others without a word, and NaN or inf weights show only later.
    Every loader checks here: checkpoints, exports and a resume."""
    for name, tensor in stored.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            kind = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"{name} holds {kind}, not floating-point weights; use weights "
                             "that charlm saved")
        if not torch.isfinite(tensor).all():
            raise ValueError(f"{name} holds NaN or inf (the weights diverged); "
                             "use an earlier checkpoint, or train again with a lower optim.lr")


def check_stored_shapes(cfg: RunConfig, vocab: Vocab | PairVocab,
                        stored: Mapping[str, torch.Tensor]) -> None:
    """Raise ValueError unless the stored weights pass `check_weights` and fit the config's model:
    block counts by name, then each shape on the meta device (a million layers allocate nothing)."""
    check_weights(stored)
    m = cfg.model
    stacks = {"model.n_layer": ("blocks", m.n_layer)}
    if m.arch == "encoder_decoder":
        stacks["model.n_encoder_layer"] = ("encoder", m.encoder_layers)
    for key, (stack, layers) in stacks.items():
        found = {int(x[1]) for name in stored if (x := re.match(rf"{stack}\.(\d+)\.", name))}
        if found != set(range(layers)):
            raise ValueError(f"{key}={layers} but the weights hold {len(found)} {stack}")
    with torch.device("meta"):
        model = build_model(cfg, vocab)
    for name, tensor in model.state_dict().items():
        if name in stored and tuple(stored[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{name} has shape {tuple(stored[name].shape)} in the weights but "
                             f"{tuple(tensor.shape)} in the config")
