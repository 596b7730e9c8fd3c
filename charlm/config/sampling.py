"""The options of `charlm sample` and of the Python API's generation calls, validated, each with
its help (`charlm.cli.options` makes the CLI's options from them); not part of a run's config."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from charlm.config.values import coerce, setting
from charlm.core.errors import CharlmError, Setting, SettingError, suggest

# Past this every character is about as likely; larger is a slip (1e46 made the float32 factor 0)
MAX_TEMPERATURE = 100.0


@dataclass
class SampleConfig:
    """Logits processors apply in order: repetition penalty, temperature, top-k, top-p, min-p."""

    max_new_tokens: int = setting(500, "Characters to generate per sample.")
    num_samples: int = setting(1, "Samples, generated as one batch (for pairs with --beams: "
                               "the n best).")
    temperature: float = setting(0.8, "Softmax temperature; 0 is greedy.")
    top_k: int | None = setting(None, "Sample only from the k likeliest.")
    top_p: float | None = setting(None, "Nucleus: sample from the smallest set with mass >= p.")
    min_p: float | None = setting(
        None, "Drop characters below min_p x the likeliest one's probability.")
    repetition_penalty: float = setting(
        1.0, "> 1 discourages characters in the recent window; 1 is off.")
    repetition_window: int = setting(64, "Recent characters the repetition penalty looks at.")
    beams: int | None = setting(  # None samples
        None, "Beam search with N beams; prints the best (1 = greedy).")
    stop: tuple[str, ...] = setting((), "End a sample when it ends with this text; repeatable.")
    include_stop: bool = setting(False, "Print the stop string that ended a sample.")
    unknown: str = setting("error", "Prompt characters outside the vocabulary: error or skip.")
    seed: int = setting(1337, "Random seed; the same seed gives the same text.")
    use_cache: bool = setting(True, "Recompute the whole context every step.", flag="--no-cache")
    compile: bool = setting(False, "torch.compile the one-token decode step (static shapes; "
                            "pays for long generations; once built it prints a step against an "
                            "eager one, and says where it is slower).", flag="--compile")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> SampleConfig:
        """From options by name (the Python API's keywords, the CLI's arguments): an unknown
        name an error naming the nearest; `stop` one string, or None for none."""
        names = [f.name for f in dataclasses.fields(cls)]
        for name in options:
            if name not in names:
                raise CharlmError(f"unknown option '{name}' for charlm.sample / charlm.generate"
                                  f"{suggest(name, names)}")
        if isinstance(options.get("stop"), str):  # one stop string, not one per character
            options = {**options, "stop": [options["stop"]]}
        elif "stop" in options and options["stop"] is None:  # None is off, as for the others
            options = {**options, "stop": ()}
        return cls(**options)

    def __post_init__(self) -> None:
        def need(ok: bool, setting: str, problem: str) -> None:
            if not ok:  # named by the Python API's keyword; the CLI says the flag
                raise SettingError(Setting(setting), problem)

        # The CLI's options arrive typed; the Python API's (`charlm.sample(**options)`) may not.
        hints = typing.get_type_hints(SampleConfig)
        for f in dataclasses.fields(self):
            setattr(self, f.name, coerce(getattr(self, f.name), hints[f.name], f.name))
        need(self.max_new_tokens >= 0, "max_new_tokens",
             f" must be >= 0, got {self.max_new_tokens}")
        need(self.num_samples >= 1, "num_samples", f" must be >= 1, got {self.num_samples}")
        need(self.temperature >= 0, "temperature",
             f" must be >= 0 (0 is greedy), got {self.temperature}")
        need(self.temperature <= MAX_TEMPERATURE, "temperature",
             f" must be <= {MAX_TEMPERATURE:g} (past it every character is about as likely as "
             f"any other), got {self.temperature:g}")
        need(self.top_k is None or self.top_k >= 1, "top_k", f" must be >= 1, got {self.top_k}")
        need(self.top_p is None or 0 < self.top_p <= 1, "top_p",
             f" must be in (0, 1], got {self.top_p}")
        need(self.min_p is None or 0 <= self.min_p <= 1, "min_p",
             f" must be in [0, 1], got {self.min_p}")
        need(self.repetition_penalty > 0, "repetition_penalty",
             f" must be > 0 (1 is off), got {self.repetition_penalty}")
        need(self.repetition_window >= 1, "repetition_window",
             f" must be >= 1, got {self.repetition_window}")
        need(self.beams is None or self.beams >= 1, "beams", f" must be >= 1, got {self.beams}")
        need(self.use_cache or not self.compile, "compile",
             " needs the KV cache: it compiles the cached decode step")
        need(all(self.stop), "stop", " must not be empty")
        need(self.unknown in ("error", "skip"), "unknown",
             f" must be 'error' or 'skip', got {self.unknown!r}")
        need(-2**63 <= self.seed < 2**64,  # what torch.Generator.manual_seed takes
             "seed", f" must be in [-2**63, 2**64 - 1], got {self.seed}")
