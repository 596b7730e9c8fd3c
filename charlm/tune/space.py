"""A search space for `charlm tune` (its file format: docs/tune.md): dotted config keys and
their distributions, and the study's settings (the keys without a dot, which `charlm tune`'s
options override), read from search files and `--search KEY=SPEC`."""

from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from charlm.config.loading import apply_overrides
from charlm.config.schema import RunConfig
from charlm.config.yaml_files import as_mapping, load_text, read_yaml_file, untext
from charlm.core.durations import duration_seconds
from charlm.core.errors import CharlmError, shown, suggest

# Study settings a search file may hold, with their defaults (None: unset).
SETTINGS: dict[str, Any] = {
    "objective": "best_val_loss", "sampler": "tpe", "pruner": "median", "pruner_warmup": None,
    "startup_trials": 5, "trials": 20, "timeout": None, "seed": None, "repeats": 1,
}
OBJECTIVES = {  # objective -> (the eval event's key reported as it goes, direction)
    "best_val_loss": ("best_val_loss", "minimize"),
    "final_val_loss": ("val_loss", "minimize"),
    "val_exact_match": ("val_exact_match", "maximize"),  # pairs
    "val_cer": ("val_cer", "minimize"),  # pairs
}
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "halving", "hyperband", "none")
# Keys a study holds fixed: its data is prepared once, its trials' run dirs are its own.
FIXED = ("data.", "train.out_dir", "train.device")
MAX_CORNERS = 4096  # combinations of range ends and choices checked up front


@dataclass(frozen=True)
class Param:
    """One searched key: a range, choices, or a value derived from another key (`of` x `times`)."""

    key: str
    kind: str  # float | int | categorical | derived
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()
    of: str | None = None
    times: float | None = None

    def suggest(self, trial: Any) -> Any:
        if self.kind == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.key, self.low, self.high, log=self.log,
                                     step=int(self.step or 1))
        return trial.suggest_categorical(self.key, list(self.choices))

    def ends(self) -> list[Any]:
        """The values checked up front: a range's two ends, or every choice."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]

    def grid(self) -> list[Any]:
        """Every value, for the grid sampler (a float range needs a step)."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.step is None:
            if self.kind == "int" and not self.log:
                return list(range(int(self.low), int(self.high) + 1))
            raise CharlmError(f"sampler grid needs a step for {self.key} (e.g. step: "
                              f"{(self.high - self.low) / 4:g}), or choices")
        n = math.floor((self.high - self.low) / self.step + 1e-9)
        values = [self.low + i * self.step for i in range(n + 1)]
        return [int(v) for v in values] if self.kind == "int" else values

    def as_dict(self) -> dict[str, Any]:
        if self.kind == "derived":
            return {"of": self.of, "times": self.times}
        if self.kind == "categorical":
            return {"type": "categorical", "choices": list(self.choices)}
        spec = {"type": self.kind, "low": self.low, "high": self.high}
        return {**spec, **({"log": True} if self.log else {}),
                **({"step": self.step} if self.step is not None else {})}


@dataclass
class Search:
    params: dict[str, Param] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def setting(self, name: str) -> Any:
        return self.settings.get(name, SETTINGS[name])

    def spec(self) -> dict[str, Any]:
        """The space as plain data: saved with the study, compared when a worker joins."""
        return {key: p.as_dict() for key, p in self.params.items()}

    def sampled(self) -> list[Param]:
        return [p for p in self.params.values() if p.kind != "derived"]

    def values(self, sampled: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """A trial's config values: its sampled ones and those derived (an int field's rounded)."""
        out = dict(sampled)
        for p in self.params.values():
            if p.kind == "derived":
                source = out[p.of] if p.of in out else lookup(base, p.of)
                value = source * p.times
                out[p.key] = round(value) if isinstance(lookup(base, p.key), int) else value
        return out

    def trial_config(self, base: dict[str, Any], sampled: dict[str, Any],
                     where: str = "the trial's config") -> RunConfig:
        """The validated config of a trial: `base` (a resolved config's dict) with its values."""
        raw = apply_overrides(copy.deepcopy(base), list(self.values(sampled, base).items()))
        return RunConfig.from_dict(raw, where)


def lookup(config: dict[str, Any], key: str) -> Any:
    section, _, name = key.partition(".")
    return config.get(section, {}).get(name)


def read_search(items: list[str]) -> Search:
    """The search given as `--search` options: each a YAML file or one `key=SPEC`."""
    search = Search()
    for item in items:
        path = Path(item)
        if path.is_file() or path.suffix.lower() in (".yaml", ".yml"):
            raw = as_mapping(read_yaml_file(path),
                             f"search file {path} must map config keys to distributions")
            where = str(path)
        elif "=" in item:
            key, _, text = item.partition("=")
            try:
                raw, where = {key.strip(): load_text(text)}, "--search"
            except Exception as e:  # yaml.YAMLError, RecursionError: one line either way
                raise CharlmError(f"--search {key.strip()}: cannot read {shown(text)} as YAML "
                                  f"({str(e).splitlines()[0]})") from None
        else:
            raise CharlmError(f"--search {item!r} is neither a search file nor KEY=SPEC (e.g. "
                              "--search 'optim.lr={type: float, low: 1e-4, high: 1e-2}')")
        for key, spec in raw.items():
            add(search, str(key), untext(spec), where)
    for p in search.params.values():
        if p.kind == "derived" and p.of in search.params and \
                search.params[p.of].kind == "derived":
            raise CharlmError(f"{p.key} is derived from {p.of}, which is derived itself; derive "
                              "it from a searched or fixed key")
    return search


def add(search: Search, key: str, spec: Any, where: str) -> None:
    if key in search.params or key in search.settings:
        raise CharlmError(f"{key} is given twice in the search ({where}); give it once")
    if "." not in key:
        if key not in SETTINGS:
            raise CharlmError(f"unknown setting '{key}' in {where}{suggest(key, SETTINGS)} "
                              "(config keys are dotted: section.key)")
        search.settings[key] = check_setting(key, spec, where)
        return
    if key.startswith(FIXED) or key in FIXED:
        raise CharlmError(f"{key} cannot be searched: a study trains every trial on the same "
                          "data, each in its own run dir under --out (give data with --data)")
    search.params[key] = parse_param(key, spec, where)


def parse_param(key: str, spec: Any, where: str) -> Param:
    at = f"{key} in {where}"
    if isinstance(spec, list):
        spec = {"type": "categorical", "choices": spec}
    if not isinstance(spec, dict):
        raise CharlmError(f"{at}: {shown(spec)} is no distribution; give {{type: float, low: A, "
                          f"high: B}}, {{type: int, ...}}, a list of choices or {{of: KEY, "
                          f"times: X}} (a fixed value goes in the config or --set)")
    if "of" in spec:
        extra = set(spec) - {"of", "times"}
        if extra or not isinstance(spec.get("times"), int | float) or \
                isinstance(spec["times"], bool) or not isinstance(spec["of"], str):
            raise CharlmError(f"{at}: a derived value is {{of: KEY, times: NUMBER}}, got "
                              f"{shown(spec)}")
        return Param(key, "derived", of=spec["of"], times=float(spec["times"]))
    kind = spec.get("type")
    allowed = {"categorical": {"type", "choices"},
               "float": {"type", "low", "high", "log", "step"},
               "int": {"type", "low", "high", "log", "step"}}
    if kind not in allowed:
        raise CharlmError(f"{at}: type must be float, int or categorical, got {shown(kind)}")
    for name in spec:
        if name not in allowed[kind]:
            raise CharlmError(f"{at}: unknown field '{name}' for type {kind}"
                              f"{suggest(name, sorted(allowed[kind]))}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices or any(
                not isinstance(c, str | int | float | bool | type(None)) for c in choices):
            raise CharlmError(f"{at}: choices must be a non-empty list of plain values")
        if len(set(map(repr, choices))) != len(choices):
            raise CharlmError(f"{at}: a choice is listed twice in {shown(choices)}")
        return Param(key, kind, choices=tuple(choices))
    return range_param(key, kind, spec, at)


def range_param(key: str, kind: str, spec: dict[str, Any], at: str) -> Param:
    number = int if kind == "int" else int | float
    what = "an integer" if kind == "int" else "a finite number"
    for name in ("low", "high"):
        value = spec.get(name)
        if not isinstance(value, number) or isinstance(value, bool) or not math.isfinite(value):
            raise CharlmError(f"{at}: {name} must be {what}, got {shown(value)}")
    low, high, log, step = spec["low"], spec["high"], spec.get("log", False), spec.get("step")
    if not isinstance(log, bool):
        raise CharlmError(f"{at}: log must be true or false, got {shown(log)}")
    if low >= high:
        raise CharlmError(f"{at}: low {low} must be below high {high}")
    if log and low <= 0:
        raise CharlmError(f"{at}: a log range needs low > 0, got {low}")
    if step is not None:
        if not isinstance(step, number) or isinstance(step, bool) or not step > 0:
            raise CharlmError(f"{at}: step must be a positive {kind}, got {shown(step)}")
        if log:
            raise CharlmError(f"{at}: give log or step, not both (Optuna samples either)")
    return Param(key, kind, low=low if kind == "int" else float(low),
                 high=high if kind == "int" else float(high), log=log, step=step)


def check_setting(name: str, value: Any, where: str) -> Any:
    at = f"{name} in {where}"
    choices = {"objective": tuple(OBJECTIVES), "sampler": SAMPLERS, "pruner": PRUNERS}
    if name in choices:
        if value not in choices[name]:
            raise CharlmError(f"{at}: {shown(value)} is not one of {', '.join(choices[name])}")
        return value
    if name == "timeout":
        return None if value is None else duration_seconds(value, name)
    if value is None and name in ("pruner_warmup", "seed"):
        return None
    least = 1 if name in ("trials", "repeats") else 0
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise CharlmError(f"{at}: {shown(value)} must be an integer >= {least}")
    return value


def check_space(search: Search, base: dict[str, Any], where: str) -> None:
    """Refuse, before any trial, a space that names no config key or can give an invalid
    config: each range end and choice alone, then every combination of them (up to
    MAX_CORNERS), through the config loader."""
    if not search.sampled():
        raise CharlmError("the search has no distribution to sample: give one with --search "
                          "(e.g. optim.lr: {type: float, low: 1e-4, high: 1e-2, log: true})")
    for p in search.params.values():
        section, _, name = p.key.partition(".")
        if section not in base:
            raise CharlmError(f"unknown section '{section}' in {p.key}{suggest(section, base)}")
        if name not in base[section]:
            raise CharlmError(f"unknown key '{p.key}'{suggest(name, base[section])}")
        if p.kind == "derived" and p.of not in search.params and lookup(base, p.of) is None:
            raise CharlmError(f"{p.key} is derived from {p.of}, which is no config key with a "
                              "numeric value")
    params = search.sampled()
    combos = [{p.key: v} for p in params for v in p.ends()]
    if math.prod(len(p.ends()) for p in params) <= MAX_CORNERS:
        combos += [dict(zip([p.key for p in params], values, strict=True))
                   for values in itertools.product(*(p.ends() for p in params))]
    for values in combos:
        try:
            search.trial_config(base, values, where)
        except CharlmError as e:
            raise CharlmError(invalid_space(values, search, str(e))) from None
        except TypeError:  # a derived value of a non-numeric key
            raise CharlmError(f"cannot derive values from {shown(values)}") from None


def invalid_space(values: dict[str, Any], search: Search, message: str) -> str:
    """Say which sampled values give which invalid config, and what to search with them."""
    given = ", ".join(f"{k}={v!r}" for k, v in values.items())
    text = f"the search space can give an invalid config: with {given}: {message}"
    named = re.search(r"(?:config value|value for|key) '?([a-z_]+\.[a-z_]+)", message)
    key = named.group(1) if named else None
    if key and key not in search.params:
        of = next(iter(values))
        text += (f"; search {key} with it (e.g. `{key}: {{of: {of}, times: 0.1}}` derives it "
                 f"from each trial's {of}), or fix it with --set")
    return text
