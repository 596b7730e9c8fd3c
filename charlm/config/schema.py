"""The run config: its sections (`optim` and `data` in modules of their own), each key with its
default and help, strict `from_dict`, `__post_init__` validation, and a run dir for a config
that names none. The defaults live only in these dataclasses."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from charlm.config.data import DataConfig
from charlm.config.optim import OptimConfig
from charlm.config.values import coerce, require, setting
from charlm.config.yaml_files import as_mapping
from charlm.core.durations import duration_seconds
from charlm.core.errors import CharlmError, suggest


def device_error(name: str) -> str | None:
    """Why `name` is not a device name, or None (whether it is there: `resolve_device`)."""
    if name in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", name):
        return None
    return f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps"


@dataclass
class ModelConfig:
    """The architecture, fixed for the life of a run: a resume takes it from the checkpoint."""

    arch: Literal["decoder", "encoder_decoder"] = setting(
        "decoder", "a GPT (`decoder`), or Vaswani's encoder-decoder for paired text "
        "(`encoder_decoder`, see docs/paired_text.md)")
    n_encoder_layer: int | None = setting(
        None, "`encoder_decoder`: the encoder's blocks; null: `n_layer`")
    block_size: int = setting(
        64, "context length in characters; `encoder_decoder`: the longest source, and the "
        "longest target with its begin id")
    n_layer: int = setting(4, "transformer blocks (`encoder_decoder`: the decoder's)")
    n_head: int = setting(4, "attention heads; must divide `n_embd`")
    n_embd: int = setting(128, "model width")
    n_ff: int | None = setting(
        None, "hidden width of the MLP; null: 4 * `n_embd`, or for `swiglu` 8 * ceil(`n_embd` "
        "/ 3), which keeps its three projections about as large as the two of the others")
    dropout: float = setting(0.0, "dropout probability, in [0, 1)")
    label_smoothing: float = setting(
        0.0, "label smoothing of the training loss, in [0, 1); eval losses are never smoothed")
    bias: bool = setting(False, "biases in the linear layers and norms")
    tie_weights: bool = setting(True, "the output head shares the token embedding's weights")
    pos_encoding: Literal["learned", "sinusoidal", "rope", "none"] = setting(
        "learned", "positions: `learned` (GPT-2's), `sinusoidal`, `rope` (rotary; needs an even "
        "head size) or `none` (the causal mask alone)")
    norm: Literal["layernorm", "rmsnorm"] = setting(
        "layernorm", "LayerNorm, or RMSNorm (no centring and no bias)")
    norm_placement: Literal["pre", "post"] = setting(
        "pre", "`pre`: x + f(norm(x)) with a final norm; `post`: norm(x + f(x)), the original "
        "Transformer's (it needs a gentler `optim.lr` and warmup)")
    activation: Literal["gelu", "relu", "relu2", "swiglu"] = setting(
        "gelu", "the MLP's nonlinearity; `relu2` is relu(x)^2 (modded-nanogpt's); `swiglu` "
        "gates it with a third projection (see `n_ff`)")
    qk_norm: bool = setting(
        False, "RMS-normalise each head's queries and keys (no weights) before attention")
    zero_init: bool = setting(
        False, "start the projections into the residual stream (attention's and the MLP's "
        "outputs) and an untied head at zero, so each block starts as the identity")
    logit_softcap: float = setting(
        0.0, "squash the logits smoothly into (-cap, cap), cap * tanh(logits / cap); 0: none")
    bigram: bool = setting(
        False, "add a learned vector per (previous, current) token pair to the input, a table "
        "of (V + 1) x V rows (V the vocabulary; the first position has no previous); "
        "`decoder` only")

    def __post_init__(self) -> None:
        for key in ("block_size", "n_layer", "n_head", "n_embd"):
            require(getattr(self, key) >= 1, f"model.{key}", "must be >= 1")
        require(self.n_encoder_layer is None or self.n_encoder_layer >= 1,
               "model.n_encoder_layer", "must be >= 1, or null for model.n_layer")
        require(self.arch == "encoder_decoder" or self.n_encoder_layer is None,
               "model.n_encoder_layer", "applies to model.arch=encoder_decoder only; remove it "
               "or set model.arch=encoder_decoder")
        require(self.n_embd % self.n_head == 0, "model.n_embd",
                f"{self.n_embd} is not divisible by model.n_head={self.n_head}; "
                "choose n_embd as a multiple of n_head")
        require(self.n_ff is None or self.n_ff >= 1, "model.n_ff", "must be >= 1 or null")
        require(0.0 <= self.dropout < 1.0, "model.dropout", f"{self.dropout} is outside [0, 1)")
        require(0.0 <= self.label_smoothing < 1.0, "model.label_smoothing",
               f"{self.label_smoothing} is outside [0, 1)")
        require(self.logit_softcap >= 0, "model.logit_softcap",
               f"{self.logit_softcap} must be >= 0 (0: no cap)")
        require(not (self.bigram and self.arch == "encoder_decoder"), "model.bigram",
               "applies to model.arch=decoder only")
        require(self.pos_encoding != "rope" or self.head_dim % 2 == 0, "model.pos_encoding",
                f"rope rotates pairs of features and needs an even head size, but n_embd / "
                f"n_head = {self.head_dim}; choose n_embd as a multiple of 2 * n_head")

    @property
    def encoder_layers(self) -> int:
        """The encoder's depth (encoder_decoder); n_layer is the decoder's."""
        return self.n_layer if self.n_encoder_layer is None else self.n_encoder_layer

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ff_width(self) -> int:
        """n_ff, else its default as its help says (for swiglu, LLaMA's rule)."""
        if self.n_ff is not None:
            return self.n_ff
        if self.activation == "swiglu":
            return 8 * ((self.n_embd + 2) // 3)  # = 8 * ceil((2/3 * 4 * n_embd) / 8)
        return 4 * self.n_embd


# Each single-option change of the architecture from the default GPT, by `key=value` name: what
# `scripts/bench.py train --variants` measures and the tests run every model path with.
MODEL_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    **{f"{key}={value}": {key: value} for key, value in [
        ("pos_encoding", "sinusoidal"), ("pos_encoding", "rope"), ("pos_encoding", "none"),
        ("norm", "rmsnorm"), ("norm_placement", "post"), ("activation", "relu"),
        ("activation", "swiglu"), ("tie_weights", False), ("bias", True),
        ("activation", "relu2"), ("qk_norm", True), ("zero_init", True), ("logit_softcap", 15.0),
        ("bigram", True),
    ]},
}


@dataclass
class TrainConfig:
    """How long a run trains, how it evaluates, checkpoints and logs, on which device, and where
    it writes."""

    max_iters: int = setting(1500, "optimizer steps")
    max_time: float | str | None = setting(
        None, "a time budget in seconds, or `30s`, `5m`, `2h` (at most a year, `8760h`), instead "
        "of `max_iters`: the schedule runs along the elapsed time and the run ends, with its "
        "final evaluation, within it (its steps follow the clock: not repeatable bitwise)")
    batch_size: int = setting(
        16, "sequences per micro-batch (of all processes together under torchrun)")
    grad_accum: int = setting(1, "micro-batches per optimizer step")
    eval_interval: int = setting(
        250, "steps between evaluations (and `best.pt` when the val loss improved)")
    eval_iters: int = setting(20, "batches per split in an evaluation")
    log_interval: int = setting(50, "steps between log lines in `metrics.jsonl` and TensorBoard")
    checkpoint_interval: int | None = setting(
        None, "steps between writes of `last.pt`; null: at every evaluation")
    keep_checkpoints: int = setting(
        0, "also write `checkpoints/step-NNNNNN.pt` at each write of `last.pt` and keep the "
        "newest N of them (`charlm sample RUN --step N`); 0: none")
    max_bad_steps: int = setting(
        5, "non-finite steps in a row (their updates skipped) that stop the run")
    sample_chars: int = setting(
        200, "characters sampled at each evaluation for TensorBoard; 0: none")
    eval_pairs: int = setting(
        200, "pairs: val sources decoded (greedy) at each evaluation for exact match and CER; "
        "0: none")
    seed: int = setting(1337, "seed of the initialisation, the batch sampler and dropout")
    device: str = setting(
        "auto", "`auto` (cuda, then mps, then cpu), `cpu`, `cuda` (the first GPU), `cuda:N` or "
        "`mps`")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto", "autocast dtype (the weights stay float32); `auto`: bfloat16 on GPUs that have "
        "it (else float16) and on CPUs that compute it in hardware and measure it faster than "
        "float32, else float32, decided once as the run starts and recorded in `config.yaml`; "
        "`float16` on CUDA only")
    compile: bool = setting(
        False, "`torch.compile` the model (eager, with a warning, where it cannot build)")
    threads: int | str = setting(
        "auto", "CPU threads to compute with; `auto`: the cores other processes leave free as "
        "the run starts (OMP_NUM_THREADS, if set), recorded in `config.yaml` so that a resume "
        "computes alike")
    out_dir: str | None = setting(
        None, "the run dir; null: `runs/<name of data.path>` (`runs/tinyshakespeare` for the "
        "defaults), fixed when the config is read and saved so in `config.yaml`")
    init_from: str | None = setting(
        None, "fine-tune: start from the weights of this run dir (its `best.pt`, else "
        "`last.pt`), checkpoint or `charlm export --format safetensors` dir, with a fresh "
        "optimizer and schedule; the architecture is the parent's, the vocabulary the union "
        "(`--init-from`); saved as the weights file used")
    init_from_sha256: str | None = setting(
        None, "the sha256 of `init_from`'s weights file (`best.pt`, `last.pt` or "
        "`model.safetensors`), recorded by the run; set, a parent with other weights is refused")

    def __post_init__(self) -> None:
        for key in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters",
                    "log_interval"):
            require(getattr(self, key) >= 1, f"train.{key}", "must be >= 1")
        require(self.checkpoint_interval is None or self.checkpoint_interval >= 1,
               "train.checkpoint_interval", "must be >= 1, or null to write last.pt at every eval")
        require(self.keep_checkpoints >= 0, "train.keep_checkpoints",
               "must be >= 0 (0 keeps no checkpoints by step)")
        require(self.max_bad_steps >= 1, "train.max_bad_steps", "must be >= 1")
        require(self.sample_chars >= 0, "train.sample_chars", "must be >= 0 (0 turns samples off)")
        require(self.eval_pairs >= 0, "train.eval_pairs", "must be >= 0 (0 decodes none)")
        require(self.out_dir != "", "train.out_dir",
               "must not be empty; null names the run dir after data.path")
        require(self.init_from != "", "train.init_from",
               "must not be empty; null trains from scratch")
        if self.max_time is not None:
            self.max_time = duration_seconds(self.max_time)
        unknown_device = device_error(self.device)
        require(unknown_device is None, "train.device", str(unknown_device))
        require(self.threads == "auto" or (isinstance(self.threads, int)
                                          and not isinstance(self.threads, bool)
                                          and self.threads >= 1),
               "train.threads", f"{self.threads!r} must be `auto` or a number >= 1")


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        if self.train.out_dir is None:  # resolved once, so config.yaml and checkpoints hold it
            self.train.out_dir = default_run_dir(self.data.path)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as YAML and JSON read it back: a list of inputs or patterns a list."""
        return dataclasses.asdict(self, dict_factory=lambda items: {
            k: list(v) if isinstance(v, tuple) else v for k, v in items})

    @classmethod
    def from_dict(cls, raw: Any, where: str = "config") -> RunConfig:
        """A validated config from plain data, typed (a checkpoint's) or YAML's text."""
        raw = as_mapping(raw, f"{where} must be a mapping of sections (model, optim, train, data)")
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, value in raw.items():
            if name not in hints:
                raise CharlmError(f"unknown section '{name}' in {where}{suggest(name, hints)}")
            kwargs[name] = build_section(hints[name], name, value, where)
        return cls(**kwargs)


def build_section(section_cls: type, section: str, raw: Any, where: str) -> Any:
    """One section's dataclass from its keys, each value read by its field's type."""
    raw = as_mapping(raw, f"section '{section}' in {where} must be a mapping of keys")
    hints = typing.get_type_hints(section_cls)
    kwargs = {}
    for key, value in raw.items():
        if key not in hints:
            raise CharlmError(f"unknown key '{section}.{key}' in {where}{suggest(key, hints)}")
        value = coerce(value, hints[key], f"{section}.{key}", where)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            # torch sizes and steps are 64-bit
            raise CharlmError(f"invalid value for {section}.{key} in {where}: {value} is too large")
        kwargs[key] = value
    return section_cls(**kwargs)


def default_run_dir(data_path: str | tuple[str, ...]) -> str:
    """`runs/<name of the (first) input>` (`runs/src` for `src/**/*.py`), so runs on other
    texts never share a run dir; made absolute without following links, so `.` names the
    current directory and a link keeps its name."""
    first = data_path if isinstance(data_path, str) else data_path[0]
    wild = [first.index(c) for c in "*?[" if c in first]
    head = first[:min(wild)].rpartition("/")[0] or "." if wild else first
    path = Path(os.path.abspath(head))
    name = "stdin" if first == "-" else (
        path.with_suffix("") if path.suffix in (".gz", ".bz2", ".xz") else path).stem
    if not name:
        raise CharlmError(f"invalid config value train.out_dir: data.path {data_path!r} has no "
                          "name to call the run dir after; set train.out_dir (or --out)")
    return str(Path("runs") / name)
