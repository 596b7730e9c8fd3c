"""Export a trained model: `safetensors` (charlm's own pickle-free format), `hf` (plain JSON and
safetensors for `transformers.GPT2LMHeadModel` and `AutoTokenizer`) and `onnx`."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save

from charlm.config.schema import ModelConfig, RunConfig
from charlm.core import files
from charlm.core.errors import CharlmError, one_line
from charlm.data.dataset_dir import META_LIMIT
from charlm.data.pairs import PairVocab
from charlm.data.vocab import Vocab
from charlm.model.gpt import GPT
from charlm.onnx_export import META, ONNX_FILES, save_onnx
from charlm.training.checkpoint import check_config
from charlm.training.tasks import build_model, check_stored_shapes, vocab_from_state

EXPORT_FORMAT = "charlm-safetensors"
EXPORT_VERSION = 1
WEIGHTS = "model.safetensors"
# Every file an export of either format writes: all that --overwrite may replace.
EXPORT_FILES = (WEIGHTS, "config.json", "vocab.json", "tokenizer.json", "tokenizer_config.json",
                *ONNX_FILES)


def _write_json(path: Path, obj: Any) -> None:
    files.write_text_atomic(path, json.dumps(obj, ensure_ascii=False, indent=1))


def _read_json(path: Path) -> Any:
    return json.loads(files.read_regular(path, "export file", META_LIMIT).decode("utf-8"))


def _write_weights(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    """By `write_atomic`, as the other files (safetensors' own save_file makes the file 0600)."""
    data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, meta)
    files.write_atomic(path, lambda f: f.write(data))


def _own_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict without the tied head (safetensors stores each tensor once)."""
    state = model.state_dict()
    if model.cfg.tie_weights:
        del state["head.weight"]
    return state


def save_safetensors(model: torch.nn.Module, vocab: Vocab | PairVocab, cfg: RunConfig,
                     out: Path) -> None:
    """A GPT or an encoder-decoder: weights, config and vocabulary (a `PairVocab` as its dict)."""
    out.mkdir(parents=True, exist_ok=True)
    _write_weights(out / WEIGHTS, _own_state(model), {"format": EXPORT_FORMAT})
    _write_json(out / "config.json", {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                                      "config": cfg.to_dict()})
    _write_json(out / "vocab.json", vocab.to_dict() if isinstance(vocab, PairVocab)
                else vocab.state())


def resolve_out(out: Path) -> Path:
    """`--out` resolved, to move an export to (`.` has no name to put a temporary beside, and a
    symlink would be replaced by the export instead of holding it)."""
    try:
        return out.resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python < 3.13's "Symlink loop"
        raise CharlmError(f"--out {out} is a loop of symbolic links; give a directory") from None


def write_dir(out: Path, write: Callable[[Path], None], overwrite: bool) -> None:
    """Run `write(dir)` into a fresh sibling directory, then move it to `out` (an earlier export
    replaced whole), so a failed or interrupted export leaves `out` as it was and no temporary;
    one a killed export had moved aside is moved back first."""
    real = resolve_out(out)
    aside = files.dead_temps(real, "old")
    if aside and not real.exists():  # a SIGKILL, or a power loss, between the two moves
        os.replace(aside[-1], real)
    check_replaceable(out, overwrite)
    made = [d for d in (real.parent, *real.parent.parents) if not d.exists()]  # deepest first
    files.make_writable_dir(real.parent, f"--out {out}")
    tmp, old = files.temp_beside(real), files.temp_beside(real, "old")
    for tag in ("tmp", "old"):  # a SIGKILL, or a power loss, before their `finally`
        files.remove_temps(real, tag, only_dead=True)
    kept = f"{out} is as it was" if real.exists() else "nothing of it is left"
    done = False
    try:
        tmp.mkdir()
        write(tmp)
        if real.exists():
            os.replace(real, old)
        os.replace(tmp, real)
        done = True
    except OSError as e:  # the file in tmp that failed is no name the user knows
        raise CharlmError(f"cannot write export {out}: {e.strerror or e}; {kept}; free disk "
                          "space (or fix the folder), then export again") from None
    finally:  # KeyboardInterrupt, SystemExit and the like too
        if old.exists() and not real.exists():  # stopped between the two moves
            os.replace(old, real)
        for leftover in (tmp, old):
            shutil.rmtree(leftover, ignore_errors=True)
        for folder in made if not done else ():
            try:
                folder.rmdir()  # only an empty one
            except OSError:
                break


def check_replaceable(out: Path, overwrite: bool) -> None:
    """`out` may be written: new, empty, or, with `overwrite`, an earlier export and nothing
    else (.git/ or another run's checkpoints are not ours)."""
    if out.exists() and not out.is_dir():
        raise CharlmError(f"--out {out} is a file; give a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    others = files.strangers(out, EXPORT_FILES) + [n for n in EXPORT_FILES if (out / n).is_dir()]
    if others or not (is_export_dir(out) or (out / META).is_file()):
        shown = files.some(others or files.strangers(out, ()))
        raise CharlmError(f"--out {out} holds files that are not an earlier export ({shown}); "
                          "give a new or empty directory, or an earlier export to replace")
    if not overwrite:
        raise CharlmError(f"--out {out} holds an earlier export; give a new directory, or "
                          "--overwrite to replace it")


def is_export_dir(path: Path) -> bool:
    """A directory with exported weights (an `hf` export too: loading says what it is)."""
    return path.is_dir() and (path / WEIGHTS).is_file()


def load_safetensors(path: Path, device: str | torch.device = "cpu",
                     ) -> tuple[torch.nn.Module, Vocab | PairVocab, RunConfig]:
    """Load a directory written by `save_safetensors` (no pickle anywhere)."""
    try:
        meta = _read_json(path / "config.json")
        if not isinstance(meta, dict) or meta.get("format") != EXPORT_FORMAT:
            raise ValueError("config.json is not a charlm export (an `hf` export is for "
                             "transformers, not for charlm)")
        if meta.get("version") != EXPORT_VERSION:
            raise ValueError(f"export format version {meta.get('version')}")
        cfg = RunConfig.from_dict(check_config(meta), f"{path / 'config.json'}")
        vocab = vocab_from_state(_read_json(path / "vocab.json"))
        state = load_file(str(path / WEIGHTS))
        check_stored_shapes(cfg, vocab, state)
        model = build_model(cfg, vocab)
        # exactly the tensors save_safetensors writes: a tied model's head.weight would be
        # loaded into the token embedding it shares
        expected = _own_state(model).keys()
        missing, unexpected = sorted(expected - state.keys()), sorted(state.keys() - expected)
        if missing or unexpected:
            raise ValueError(f"weights do not match the config (missing {missing}, "
                             f"unexpected {unexpected})")
        model.load_state_dict(state, strict=False)  # strict would want the tied head.weight
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, CharlmError,
            SafetensorError) as e:
        raise CharlmError(f"cannot load exported model {path}: {one_line(e)}") from None
    return model.to(device).eval(), vocab, cfg


def save_hf(model: GPT, vocab: Vocab, cfg: RunConfig, out: Path) -> None:
    """A GPT-2 directory: config.json, model.safetensors and a character-level tokenizer."""
    m = cfg.model
    wanted = {"pos_encoding": "learned", "norm": "layernorm", "norm_placement": "pre",
              "activation": "gelu", "qk_norm": False, "logit_softcap": 0.0, "bigram": False}
    bad = ([f"model.arch={m.arch!r} (GPT-2 is a decoder only)"] if m.arch != "decoder" else
           [f"model.{k}={getattr(m, k)!r} (GPT-2 has {v!r})" for k, v in wanted.items()
            if getattr(m, k, v) != v])
    if isinstance(vocab, Vocab) and vocab.units != "char":  # its tokenizer: a token a character
        bad.append(f"{vocab.units} units (the GPT-2 tokenizer written is character-level)")
    if bad:
        raise CharlmError(
            "this model cannot be exported as GPT-2 (--format hf): " + ", ".join(bad)
            + "; use --format safetensors"
        )
    out.mkdir(parents=True, exist_ok=True)
    _write_weights(out / WEIGHTS, gpt2_weights(model.state_dict(), m), {"format": "pt"})
    _write_json(out / "config.json", {
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
        "vocab_size": len(vocab), "n_positions": m.block_size, "n_ctx": m.block_size,
        "n_embd": m.n_embd, "n_layer": m.n_layer, "n_head": m.n_head, "n_inner": m.ff_width,
        "activation_function": "gelu",  # exact erf GELU, as F.gelu
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02, "scale_attn_weights": True, "use_cache": True,
        "tie_word_embeddings": m.tie_weights, "bos_token_id": None, "eos_token_id": None,
        "pad_token_id": None,
    })
    _write_json(out / "tokenizer.json", {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        # Characters outside the vocabulary are dropped (charlm's --unknown skip): the model has
        # no row for an unknown token, so the WordLevel `unk_token` below is never reached.
        "normalizer": {"type": "Replace", "pattern": {"Regex": _outside(vocab.chars)},
                       "content": ""},
        # Every character (newlines included) is its own token; the decoder joins them as is.
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"},
                          "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": {c: i for i, c in enumerate(vocab.chars)},
                  "unk_token": "<unk>"},
    })
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
        "model_max_length": m.block_size,
    })


def _outside(chars: list[str]) -> str:
    """A regex (Oniguruma's, as `tokenizers` reads it) for one character not in `chars`: a
    class of code point ranges, each written as `\\x{HEX}`, so no character needs escaping."""
    ranges: list[list[int]] = []
    for cp in sorted(map(ord, chars)):
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return "[^" + "".join(f"\\x{{{a:x}}}" + (f"-\\x{{{b:x}}}" if b > a else "")
                          for a, b in ranges) + "]"


def export_notes(format_: str, cfg: RunConfig, vocab: Vocab | PairVocab) -> list[str]:
    """What `charlm export` says of an export: its context, and hf's limits."""
    context = f"context: {cfg.model.block_size:,} characters (model.block_size"
    if format_ != "hf":
        return [f"{context})"]
    return [f"{context}, n_positions): transformers' generate fails once prompt and new tokens "
            "pass it, where charlm sample slides its window",
            f"tokenizer: characters outside the model's {len(vocab):,} are dropped (it has no "
            "unknown token)"]


def gpt2_weights(state: dict[str, torch.Tensor], m: ModelConfig) -> dict[str, torch.Tensor]:
    """A GPT's state dict under GPT-2's names, its linear weights in Conv1D's (in, out) layout,
    and a zero bias for each one a model without biases lacks."""

    def bias(key: str, size: int) -> torch.Tensor:
        return state.get(key, torch.zeros(size))

    hf: dict[str, torch.Tensor] = {
        "transformer.wte.weight": state["wte.weight"],
        "transformer.wpe.weight": state["wpe.weight"],
        "transformer.ln_f.weight": state["ln_f.weight"],
        "transformer.ln_f.bias": bias("ln_f.bias", m.n_embd),
    }
    for i in range(m.n_layer):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        pairs = {"attn.c_attn": ("attn.qkv", 3 * m.n_embd), "attn.c_proj": ("attn.proj", m.n_embd),
                 "mlp.c_fc": ("mlp.fc", m.ff_width), "mlp.c_proj": ("mlp.proj", m.n_embd)}
        for hf_name, (name, out_features) in pairs.items():
            hf[f"{dst}{hf_name}.weight"] = state[f"{src}{name}.weight"].t()
            hf[f"{dst}{hf_name}.bias"] = bias(f"{src}{name}.bias", out_features)
        for ln in ("ln_1", "ln_2"):
            hf[f"{dst}{ln}.weight"] = state[f"{src}{ln}.weight"]
            hf[f"{dst}{ln}.bias"] = bias(f"{src}{ln}.bias", m.n_embd)
    if not m.tie_weights:
        hf["lm_head.weight"] = state["head.weight"]
    return hf


# `charlm export --format NAME`: each format's writer of (model, vocab, cfg, dir)
FORMATS: dict[str, Callable[..., None]] = {"safetensors": save_safetensors, "hf": save_hf,
                                           "onnx": save_onnx}


def export_model(model: torch.nn.Module, vocab: Vocab | PairVocab, cfg: RunConfig, source: Path,
                 out: Path, format_: str, overwrite: bool) -> None:
    """`charlm export` of the model from `source` to `out`, refused where `out` holds the source
    or lies inside its run dir: --overwrite would delete it."""
    real, resolved = resolve_out(out), source.resolve()
    if real in (resolved, *resolved.parents):
        raise CharlmError(f"--out {out} holds the model being exported ({source}); give "
                          "another directory")
    run = resolved.parent if resolved.is_file() else resolved  # its run dir, or the export
    if run in real.parents and real.exists() and not is_export_dir(real):  # tb/, dataset/
        raise CharlmError(f"--out {out} is part of the run in {run}; give a directory outside "
                          "it (or an earlier export)")
    write_dir(out, lambda d: FORMATS[format_](model, vocab, cfg, d), overwrite)
