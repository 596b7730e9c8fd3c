"""The Python API for notebooks and scripts:

    import charlm
    lm = charlm.load("runs/shakespeare_char_cpu")        # a run dir, a .pt, or an export dir
    print(charlm.generate(lm, "ROMEO:", max_new_tokens=200, temperature=0.8))
    print(charlm.score(lm, open("data/tinyshakespeare.txt").read()[-5000:]).bpc)
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from charlm import export
from charlm.config.sampling import SampleConfig
from charlm.config.schema import RunConfig
from charlm.config.values import coerce
from charlm.core.errors import CharlmError, suggest
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab
from charlm.evaluation.scoring import score_text
from charlm.generation import seq2seq
from charlm.generation.text import default_prompt, encode_prompt, sample_text
from charlm.model.gpt import GPT
from charlm.model.layers import lay_out_for_decoding
from charlm.runtime.device import resolve_device
from charlm.runtime.precision import weights_dtype
from charlm.runtime.profile import DecodeLayout, layout_for
from charlm.training import checkpoint


@dataclass
class LM:
    """A loaded model with its vocabulary and the config it was trained with."""

    model: GPT | torch.nn.Module  # a GPT, or an EncoderDecoder for model.arch=encoder_decoder
    vocab: Vocab | PairVocab
    config: RunConfig
    source: Path
    train_state: dict[str, Any] = field(default_factory=dict)  # empty for an export
    layout: DecodeLayout | None = None  # the split `decoding_model` chose, once it has

    def decoding_model(self) -> GPT | torch.nn.Module:
        """The model, its large float32 CPU products split over the threads at the first call
        where that pays here (`layout_for`); the weights stay row-major, savable."""
        if self.layout is None:
            self.layout = layout_for(self.model, column_major=False)
            lay_out_for_decoding(self.model, self.layout.split_parts, column_major=False)
        return self.model


def load(path: str | Path, device: str = "auto", dtype: str = "float32",
         step: int | None = None) -> LM:
    """Load a run dir (its best.pt, else last.pt, or its checkpoint of `step`), a checkpoint
    file or a safetensors export, its weights in `dtype` (`precision.weights_dtype`)."""
    if not isinstance(path, (str, os.PathLike)):
        raise CharlmError(f"charlm.load() takes a path (str or Path), got {type(path).__name__}")
    device = coerce(device, str, "device")
    weights = weights_dtype(coerce(dtype, str, "dtype"))
    path = Path(path)
    dev = resolve_device(device, "device")
    if step is not None:
        step = coerce(step, int, "step")
        path = checkpoint.resolve(path, step)
    if export.is_export_dir(path):
        model, vocab, cfg = export.load_safetensors(path, dev)
        return LM(model.to(weights), vocab, cfg, path)
    model, vocab, cfg, state = checkpoint.load_model(path, dev)
    return LM(model.to(weights), vocab, cfg, checkpoint.resolve(path), state["train_state"])


def sample(lm: LM, prompt: str | None = None, **options: Any) -> list:
    """Generate samples (`generation.text.Sample`: text, prompt, tokens, seconds, stopped); options
    are `SampleConfig`'s (temperature, top_k, top_p, beams, stop, num_samples, seed, ...)."""
    return _sample(lm, prompt, SampleConfig.from_options(options))


def _sample(lm: LM, prompt: str | None, opts: SampleConfig) -> list:
    _check_lm(lm, "decoder")
    if prompt is None:  # a newline (or the first character of a vocabulary without one)
        prompt = default_prompt(lm.vocab)
    _check_text(prompt, "prompt")
    prompt, _, notes = encode_prompt(lm.vocab, prompt, opts.unknown, lm.model.cfg.block_size)
    for note in notes:  # what the CLI prints as `warning:` lines
        warnings.warn(note, UserWarning, stacklevel=3)  # the caller of sample / generate
    return sample_text(lm.decoding_model(), lm.vocab, prompt, opts)


def generate(lm: LM, prompt: str | None = None, **options: Any) -> str:
    """The generated continuation of `prompt` (without the prompt) as one string."""
    opts = SampleConfig.from_options(options)
    if opts.num_samples != 1:
        raise CharlmError("generate() returns one string; use charlm.sample() for num_samples > 1")
    return _sample(lm, prompt, opts)[0].text


def score(lm: LM, text: str, stride: int | None = None, unknown: str = "error",
          progress: bool = False, **other: Any):
    """Loss (nats/char), bits per char and perplexity of `text` (`charlm.evaluation.scoring`)."""
    for name in other:  # named as generate's options are, not a bare TypeError
        raise CharlmError(f"unknown option '{name}' for charlm.score"
                          f"{suggest(name, ['stride', 'unknown', 'progress'])}")
    _check_lm(lm, "decoder")
    _check_text(text, "text")
    stride = coerce(stride, int | None, "stride")
    result = score_text(lm.model, lm.vocab, text, stride, unknown, progress)
    for note in result.notes():  # what the CLI prints as `warning:` lines
        warnings.warn(note, UserWarning, stacklevel=2)
    return result


def translate(lm: LM, sources: str | Sequence[str], **options: Any) -> list:
    """A `seq2seq.Translation` per source (`.text`, the best output; `.outputs`, (text,
    score) for every sample or n-best hypothesis). Options are `sample`'s, greedy by default."""
    _check_lm(lm, "encoder_decoder")
    if isinstance(sources, str):
        sources = [sources]
    for source in sources:
        _check_text(source, "source")
    opts = SampleConfig.from_options({"temperature": 0, **options})
    return list(seq2seq.translate(lm.decoding_model(), lm.vocab, list(sources), opts))


def _check_lm(lm: Any, arch: str) -> None:
    if not isinstance(lm, LM):
        raise CharlmError(f"expected a model from charlm.load(), got {type(lm).__name__}")
    if lm.config.model.arch != arch:
        use = "charlm.translate" if arch == "decoder" else "charlm.sample / generate / score"
        raise CharlmError(f"{lm.source} holds a model.arch={lm.config.model.arch} model; use "
                          f"{use} with it")


def _check_text(text: Any, what: str) -> None:
    if not isinstance(text, str):
        raise CharlmError(f"the {what} must be a str, got {type(text).__name__}")
