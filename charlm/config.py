"""Typed run configuration: the dataclasses, YAML loading, `--set` overrides and validation.

Defaults live only here. YAML -> `--set section.key=value` overrides (values parsed as YAML) ->
strict `from_dict` (unknown keys rejected with the nearest valid name, types checked) ->
`__post_init__` validation. Precedence: CLI > YAML > defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from charlm.errors import CharlmError
from charlm.files import write_text_atomic

_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    """yaml.safe_load, with YAML 1.2's numbers instead of YAML 1.1's: `3e-4` is a number, not
    the string '3e-4'; `010` is ten, not octal eight (octal is `0o10`); and `1:30` is a string,
    not the base-60 number 90. A key given twice in one mapping is an error (PyYAML keeps the
    last one silently, so a second `optim:` section would reset the first one's keys to their
    defaults)."""

    yaml_implicit_resolvers = {  # YAML 1.1's int and float syntax out; 1.2's added below
        first: [(tag, regex) for tag, regex in resolvers if tag not in (_INT, _FLOAT)]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(self.construct_scalar(node)).replace("_", "")
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        base = {"0b": 2, "0o": 8, "0x": 16}.get(digits[:2], 10)
        return sign * int(digits[2:] if base != 10 else digits, base)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key '{key}'", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


class _Dumper(yaml.SafeDumper):
    """yaml.safe_dump that quotes the strings `_Loader` would read as something else: PyYAML's
    own dumper writes the string '1e5' plain, which `_Loader` reads back as a float."""


_Loader.add_constructor(_INT, _Loader.construct_yaml_int)
for _cls in (_Loader, _Dumper):  # the dumper keeps YAML 1.1's too: it quotes more, never less
    # Each form holds a digit: `._` or `0x_` alone is a string, not a float('.') that fails.
    _cls.add_implicit_resolver(  # an int before a float: the float syntax matches `10` too
        _INT,
        re.compile(r"^[-+]?(?:[0-9][0-9_]*|0b_*[01][01_]*|0o_*[0-7][0-7_]*"
                   r"|0x_*[0-9a-fA-F][0-9a-fA-F_]*)$"),
        list("-+0123456789"),
    )
    _cls.add_implicit_resolver(
        _FLOAT,
        re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\._*[0-9][0-9_]*)"
                   r"(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."),
    )


def parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def dump_yaml(data: Any) -> str:
    """YAML text that `parse_yaml` reads back as `data` (keys in their order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def device_error(name: str) -> str | None:
    """Why `name` is not a device name (auto, cpu, cuda, cuda:N, mps), or None when it is one.
    Whether the device is there is `device.resolve_device`'s question."""
    if name in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", name):
        return None
    return f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps"


def _check(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise CharlmError(f"invalid config value {key}: {msg}")


@dataclass
class ModelConfig:
    block_size: int = 64
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    n_ff: int | None = None  # hidden width of the MLP; None: see `ff_width`
    dropout: float = 0.0
    bias: bool = False
    tie_weights: bool = True
    pos_encoding: Literal["learned", "sinusoidal", "rope", "none"] = "learned"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_placement: Literal["pre", "post"] = "pre"
    activation: Literal["gelu", "relu", "swiglu"] = "gelu"

    def __post_init__(self) -> None:
        for key in ("block_size", "n_layer", "n_head", "n_embd"):
            _check(getattr(self, key) >= 1, f"model.{key}", "must be >= 1")
        _check(
            self.n_embd % self.n_head == 0,
            "model.n_embd",
            f"{self.n_embd} is not divisible by model.n_head={self.n_head}; "
            "choose n_embd as a multiple of n_head",
        )
        _check(self.n_ff is None or self.n_ff >= 1, "model.n_ff", "must be >= 1 or null")
        _check(0.0 <= self.dropout < 1.0, "model.dropout", f"{self.dropout} is outside [0, 1)")
        _check(
            self.pos_encoding != "rope" or self.head_dim % 2 == 0,
            "model.pos_encoding",
            f"rope rotates pairs of features and needs an even head size, but n_embd / n_head = "
            f"{self.head_dim}; choose n_embd as a multiple of 2 * n_head",
        )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ff_width(self) -> int:
        """Hidden width of the MLP: n_ff when set; else 4 * n_embd, or for swiglu 2/3 of that
        rounded up to a multiple of 8 (LLaMA's rule), so its three projections hold about as
        many parameters as the two of the 4 * n_embd MLP."""
        if self.n_ff is not None:
            return self.n_ff
        if self.activation == "swiglu":
            return 8 * ((self.n_embd + 2) // 3)  # = 8 * ceil((2/3 * 4 * n_embd) / 8)
        return 4 * self.n_embd


# Each single-option change of the architecture from the default GPT, by `key=value` name: what
# scripts/compare_variants.py measures and the tests run every model path with.
MODEL_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    **{f"{key}={value}": {key: value} for key, value in [
        ("pos_encoding", "sinusoidal"), ("pos_encoding", "rope"), ("pos_encoding", "none"),
        ("norm", "rmsnorm"), ("norm_placement", "post"), ("activation", "relu"),
        ("activation", "swiglu"), ("tie_weights", False), ("bias", True),
    ]},
}


@dataclass
class OptimConfig:
    lr: float = 4e-3
    min_lr: float = 4e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    warmup_iters: int = 50
    lr_decay_iters: int | None = None  # None means train.max_iters

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optim.lr", f"{self.lr} must be > 0")
        _check(0 <= self.min_lr <= self.lr, "optim.min_lr",
               f"{self.min_lr} must be in [0, lr], and lr is {self.lr}; set optim.min_lr to at "
               f"most lr, e.g. lr / 10 = {self.lr / 10:g}")
        _check(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        for key in ("beta1", "beta2"):
            value = getattr(self, key)
            _check(0 <= value < 1, f"optim.{key}", f"{value} is outside [0, 1)")
        _check(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)")
        _check(self.warmup_iters >= 0, "optim.warmup_iters", "must be >= 0")
        _check(  # the cosine runs from the end of the warmup to lr_decay_iters
            self.lr_decay_iters is None or self.lr_decay_iters > max(self.warmup_iters, 0),
            "optim.lr_decay_iters",
            f"must be more than optim.warmup_iters ({self.warmup_iters}), or null",
        )


@dataclass
class TrainConfig:
    max_iters: int = 1500
    batch_size: int = 16
    grad_accum: int = 1
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 50
    checkpoint_interval: int | None = None  # steps between writes of last.pt; None: every eval
    max_bad_steps: int = 5  # non-finite steps (updates skipped) in a row that stop the run
    sample_chars: int = 200  # characters sampled at each eval for TensorBoard; 0: none
    seed: int = 1337
    device: str = "auto"  # auto, cpu, cuda (the first GPU), cuda:N or mps
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    compile: bool = False
    out_dir: str = "runs/shakespeare_char_cpu"

    def __post_init__(self) -> None:
        for key in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters",
                    "log_interval"):
            _check(getattr(self, key) >= 1, f"train.{key}", "must be >= 1")
        _check(self.checkpoint_interval is None or self.checkpoint_interval >= 1,
               "train.checkpoint_interval", "must be >= 1, or null to write last.pt at every eval")
        _check(self.max_bad_steps >= 1, "train.max_bad_steps", "must be >= 1")
        _check(self.sample_chars >= 0, "train.sample_chars", "must be >= 0 (0 turns samples off)")
        _check(bool(self.out_dir), "train.out_dir", "must not be empty")
        unknown_device = device_error(self.device)
        _check(unknown_device is None, "train.device", str(unknown_device))


@dataclass
class DataConfig:
    path: str = "data/tinyshakespeare.txt"  # a text file, or a directory made by `charlm prepare`
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        _check(bool(self.path), "data.path", "must not be empty")
        _check(
            0 < self.val_fraction < 1,
            "data.val_fraction",
            f"{self.val_fraction} is outside (0, 1)",
        )


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: Any, where: str = "config") -> RunConfig:
        """Build a validated config from plain data, rejecting unknown sections and keys."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise CharlmError(
                f"{where} must be a mapping of sections (model, optim, train, data), "
                f"got {type(raw).__name__}"
            )
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for name, value in raw.items():
            if name not in sections:
                raise CharlmError(f"unknown section '{name}' in {where}{suggest(name, sections)}")
            kwargs[name] = _build_section(hints[name], name, value, where)
        return cls(**kwargs)


def suggest(name: str, valid: typing.Iterable[str]) -> str:
    valid = list(valid)
    close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.5)
    if close:
        return f", did you mean '{close[0]}'?"
    return f"; valid names are: {', '.join(valid)}"


def _build_section(section_cls: type, section: str, raw: Any, where: str) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise CharlmError(
            f"section '{section}' in {where} must be a mapping of keys, got {type(raw).__name__}"
        )
    hints = typing.get_type_hints(section_cls)
    kwargs = {}
    for key, value in raw.items():
        if key not in hints:
            raise CharlmError(
                f"unknown key '{section}.{key}' in {where}{suggest(key, hints)}"
            )
        value = coerce(value, hints[key], f"{section}.{key}", where)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
            # torch sizes and steps are 64-bit
            raise CharlmError(f"invalid value for {section}.{key} in {where}: {value} is too large")
        kwargs[key] = value
    return section_cls(**kwargs)


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(c) for c in typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"a list, each item {_type_name(typing.get_args(tp)[0])}"
    return {type(None): "null", int: "an integer", float: "a number", bool: "true/false",
            str: "a string"}.get(tp, str(tp))


def coerce(value: Any, tp: Any, key: str, where: str = "") -> Any:
    """Return `value` as type `tp`, or raise a CharlmError that says what is allowed."""
    at = f" in {where}" if where else ""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return coerce(value, arg, key, where)
            except CharlmError:
                if arg is float and isinstance(value, float):  # NaN or inf: say so
                    raise
    elif origin is Literal:
        if value in typing.get_args(tp):
            return value
    elif tp is type(None):
        if value is None:
            return None
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif origin is tuple:  # tuple[X, ...], given as a list or a tuple
        if isinstance(value, (list, tuple)):
            return tuple(coerce(item, typing.get_args(tp)[0], key, where) for item in value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if math.isfinite(value):
                return float(value)
            # A NaN fails every range check, but an infinite lr or weight decay would pass them.
            raise CharlmError(f"invalid value for {key}{at}: {value}, expected a finite number")
    elif tp is str and isinstance(value, str):
        return value
    raise CharlmError(f"invalid value for {key}{at}: {value!r}, expected {_type_name(tp)}")


def is_config_file(path: Path) -> bool:
    """Whether a command-line path names a YAML config (`.yaml` / `.yml`, in any case) rather
    than text, a dataset dir or a checkpoint."""
    return path.suffix.lower() in (".yaml", ".yml") and not path.is_dir()


def _read_yaml(path: Path) -> Any:
    if not path.exists():
        raise CharlmError(f"config file not found: {path}")
    if path.is_dir():
        raise CharlmError(f"config path is a directory, not a YAML file: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise CharlmError(f"config file is not UTF-8 text: {path} (byte {e.start})") from None
    try:
        return parse_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if "'\\t'" in problem:
            problem += "; YAML indents with spaces, not tabs"
        raise CharlmError(f"YAML syntax error in {path}{at}: {problem}") from None


def apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str]) -> dict[str, Any]:
    """Apply `section.key=value` strings (value parsed as YAML) onto a raw config dict. A key
    given twice is an error, as it is in a YAML file: the later one would win silently."""
    seen: set[str] = set()
    for item in overrides:
        dotted, sep, text = item.partition("=")
        dotted = dotted.strip()
        section, dot, key = dotted.partition(".")
        if not sep or not dot or not section or not key:
            raise CharlmError(
                f"--set expects section.key=value, got {item!r} (e.g. --set optim.lr=1e-3)"
            )
        if dotted in seen:
            raise CharlmError(f"--set {dotted} is given twice; give it once")
        seen.add(dotted)
        try:
            value = parse_yaml(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        section_raw = raw.setdefault(section, {})
        if not isinstance(section_raw, dict):
            raise CharlmError(f"cannot --set {dotted}: section '{section}' is not a mapping")
        section_raw[key] = value
    return raw


def override(key: str, value: Any) -> str:
    """The `--set` item that sets `key` to `value` exactly, whatever characters it holds: a
    double-quoted YAML scalar whose escapes PyYAML reads back (JSON's surrogate pairs for
    characters outside the BMP, such as an emoji in a file name, it would not)."""
    return key + "=" + yaml.safe_dump(value, default_style='"', width=math.inf)


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> RunConfig:
    """Defaults <- YAML file (if any) <- `--set` overrides, validated."""
    raw: Any = {}
    where = "the defaults"
    if path is not None:
        raw = _read_yaml(Path(path))
        where = str(path)
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise CharlmError(
                f"{path} must hold a mapping of sections (model, optim, train, data), "
                f"got {type(raw).__name__}"
            )
    if overrides:
        raw = apply_overrides(raw, overrides)
        where = f"{where} with --set overrides" if path else "--set overrides"
    return RunConfig.from_dict(raw, where)


def save_config(cfg: RunConfig, path: Path) -> None:
    """Write the resolved config as YAML, atomically (a resume rewrites it)."""
    write_text_atomic(path, dump_yaml(cfg.to_dict()))


@dataclass
class SampleConfig:
    """Options of `charlm sample` and of `generate.sample_text`; not part of a run's YAML.

    Logits processors apply in this order: repetition penalty, temperature, top-k, top-p, min-p.
    """

    max_new_tokens: int = 500
    num_samples: int = 1
    temperature: float = 0.8  # 0 means greedy
    top_k: int | None = None
    top_p: float | None = None  # nucleus: the smallest set of ids with probability mass >= top_p
    min_p: float | None = None  # drop ids less likely than min_p * the likeliest one
    repetition_penalty: float = 1.0  # > 1 discourages characters seen in the recent window
    repetition_window: int = 64
    beams: int | None = None  # beam search with this many beams (1 = greedy); None samples
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    unknown: str = "error"  # or "skip"
    seed: int = 1337
    use_cache: bool = True
    compile: bool = False  # torch.compile the one-token decode step (static shapes)

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise CharlmError(msg)

        # The CLI's options arrive typed; the Python API's (`charlm.sample(**options)`) may not.
        hints = typing.get_type_hints(SampleConfig)
        for f in dataclasses.fields(self):
            option = f.name if f.name == "use_cache" else "--" + f.name.replace("_", "-")
            setattr(self, f.name, coerce(getattr(self, f.name), hints[f.name], option))
        need(self.max_new_tokens >= 0, f"--max-new-tokens must be >= 0, got {self.max_new_tokens}")
        need(self.num_samples >= 1, f"--num-samples must be >= 1, got {self.num_samples}")
        need(self.temperature >= 0,
             f"--temperature must be >= 0 (0 is greedy), got {self.temperature}")
        need(self.top_k is None or self.top_k >= 1, f"--top-k must be >= 1, got {self.top_k}")
        need(self.top_p is None or 0 < self.top_p <= 1,
             f"--top-p must be in (0, 1], got {self.top_p}")
        need(self.min_p is None or 0 <= self.min_p <= 1,
             f"--min-p must be in [0, 1], got {self.min_p}")
        need(self.repetition_penalty > 0,
             f"--repetition-penalty must be > 0 (1 is off), got {self.repetition_penalty}")
        need(self.repetition_window >= 1,
             f"--repetition-window must be >= 1, got {self.repetition_window}")
        need(self.beams is None or self.beams >= 1, f"--beams must be >= 1, got {self.beams}")
        need(self.beams is None or self.num_samples == 1,
             "--beams returns the single best sequence; use --num-samples 1 with --beams")
        need(self.use_cache or not self.compile,
             "--compile compiles the KV-cached decode step; it cannot go with --no-cache")
        need(all(self.stop), "--stop must not be empty")
        need(self.unknown in ("error", "skip"),
             f"--unknown must be 'error' or 'skip', got {self.unknown!r}")
        need(-2**63 <= self.seed < 2**64,  # what torch.Generator.manual_seed takes
             f"--seed must be in [-2**63, 2**64 - 1], got {self.seed}")
