"""Models sized to a time budget: `charlm train TEXT --time 10m` with no config picks the GPT for
the budget, this machine's measured speed and the data's size (`size_model`), and says what it
picked and why in one line. The keys the user set (`--set model.n_layer=6`) win over the pick.

The rule, fitted on this project's runs (docs/design.md, "Models sized to the budget"):

1. A ladder of GPTs (`LADDER`), each about twice the parameters of the one before, with the
   block size, batch and learning rate that suit it; rotary positions and a SwiGLU MLP, as the
   CPU presets tuned on an AVX2 EPYC have. Both cost speed elsewhere (0.795x a step in bf16 on
   an AVX512_BF16 Xeon, about 0.7x on an H200): a GPT-2-shaped ladder is not measured yet.
2. Each rung's training speed is measured here, from the smallest up (`measure_rate`: a few
   steps on random tokens with the run's device, dtype and threads).
3. The pick is the largest rung whose tokens in the budget (its rate over TRAIN_SHARE of the
   budget) reach TOKENS_PER_PARAMETER times its parameters: a bigger model than that sees too
   few tokens to beat it in the time. The smallest rung when none does.
4. Dropout from the epochs the pick makes of the training split (`DROPOUT`): none below 10, 0.1
   from 10, 0.2 from 32 (nanoGPT's for its baby GPT, about 90 epochs of tiny-shakespeare; 0.1
   let a 6 x 384 at 56 epochs on an H200 overfit from its best 1.48 to 1.82). Dropout costs a
   quarter of a CPU step's speed and, at about 5 epochs, cost 0.04 nats of val loss at the same
   step; a 4 x 192 without it began to overfit at 8 epochs, and at 15 its best val was 1.5016
   against 1.4929 with 0.1.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from typing import Any

import torch

from charlm.config.schema import ModelConfig, RunConfig
from charlm.core.durations import format_duration
from charlm.model.gpt import GPT, parameter_count
from charlm.runtime.distributed import Dist
from charlm.runtime.precision import autocast
from charlm.training.tasks import TextTask

TOKENS_PER_PARAMETER = 4.0  # fitted: see the module's docstring
TRAIN_SHARE = 0.85  # of the budget spent in training steps (start-up and evaluations take the rest)
DROPOUT = ((32.0, 0.2), (10.0, 0.1))  # (epochs from which, dropout); none below the last
MEASURE_S = 0.2  # each rung's speed is timed over at least this long, after one untimed step


@dataclasses.dataclass(frozen=True)
class Rung:
    """One size of the ladder: the model's shape and the batch and learning rate it trains at."""

    n_layer: int
    n_embd: int
    n_head: int
    block_size: int
    batch_size: int
    lr: float

    def block(self, room: int | None) -> int:
        """Its block, cut to `room`, the longest the data's splits allow (None: any)."""
        return self.block_size if room is None else max(1, min(self.block_size, room))

    def model(self, room: int | None = None) -> ModelConfig:
        return ModelConfig(n_layer=self.n_layer, n_embd=self.n_embd, n_head=self.n_head,
                           block_size=self.block(room), pos_encoding="rope",
                           activation="swiglu")

    def __str__(self) -> str:
        return f"{self.n_layer} x {self.n_embd}"


LADDER = (  # the two smallest are the CPU presets' shapes
    Rung(2, 96, 4, 64, 16, 3e-3),
    Rung(2, 128, 4, 64, 16, 4.5e-3),
    Rung(4, 128, 4, 64, 16, 4e-3),
    Rung(4, 192, 4, 128, 16, 3e-3),
    Rung(4, 256, 4, 128, 16, 2e-3),
    Rung(6, 256, 4, 256, 16, 1.5e-3),
    Rung(6, 384, 6, 256, 64, 1e-3),  # nanoGPT's baby GPT
    Rung(8, 512, 8, 256, 64, 8e-4),
    Rung(12, 768, 12, 256, 64, 6e-4),
)


@dataclasses.dataclass
class Pick:
    """The rung picked, with what the rule saw: its rate (tokens/s), its tokens in the budget,
    its parameters, the epochs of the training split, and the next rung's tokens a parameter
    (None: the ladder's top)."""

    rung: Rung
    rate: float
    tokens: float
    params: int
    epochs: float
    block_size: int
    next_ratio: float | None

    @property
    def dropout(self) -> float:
        return next((p for epochs, p in DROPOUT if self.epochs >= epochs), 0.0)

    def keys(self, given: Collection[str], lr: float) -> dict[str, Any]:
        """The config keys of the pick, less those the user set; `lr`: the run's peak rate
        (the user's, if set), whose tenth min_lr is."""
        r = self.rung
        keys = {"model.n_layer": r.n_layer, "model.n_embd": r.n_embd, "model.n_head": r.n_head,
                "model.block_size": self.block_size, "model.dropout": self.dropout,
                "model.pos_encoding": "rope", "model.activation": "swiglu",
                "optim.lr": r.lr, "optim.min_lr": lr / 10, "train.batch_size": r.batch_size}
        return {k: v for k, v in keys.items() if k not in given}

    def line(self, seconds: float) -> str:
        why = (f"{self.tokens / self.params:.1f} tokens a parameter, {self.epochs:.1f} epochs "
               f"of the training text; the next size up would get "
               f"{self.next_ratio:.1f} a parameter, the rule wants {TOKENS_PER_PARAMETER:g}"
               if self.next_ratio is not None else "the largest size charlm picks")
        return (f"model sized to {format_duration(seconds)}: {self.rung} (layers x width), "
                f"block {self.block_size}, {self.params / 1e6:.2f}M parameters, dropout "
                f"{self.dropout:g}: at {self.rate:,.0f} tok/s measured here it trains on "
                f"{self.tokens / 1e6:.1f}M tokens, {why} (a config or --set overrides)")


def pick(seconds: float, rate: Callable[[Rung], float], train_tokens: int, vocab_size: int,
         room: int | None = None) -> Pick:
    """The rung for a budget of `seconds` (the rule of the module's docstring): `rate(rung)`
    its measured tokens/s, asked from the smallest rung up until the rule stops; `room`: the
    longest block the data's splits allow (None: any)."""
    chosen: Pick | None = None
    for rung in LADDER:
        params = parameter_count(rung.model(room), vocab_size)
        speed = rate(rung)
        tokens = speed * TRAIN_SHARE * seconds
        if chosen is not None and tokens < TOKENS_PER_PARAMETER * params:
            chosen.next_ratio = tokens / params
            return chosen
        chosen = Pick(rung, speed, tokens, params, tokens / max(train_tokens, 1),
                      rung.block(room), None)
    assert chosen is not None
    return chosen


def measure_rate(model_cfg: ModelConfig, batch_size: int, vocab_size: int,
                 device: torch.device, dtype: torch.dtype) -> float:
    """Training tokens a second of this model here: AdamW steps on random tokens, timed for at
    least MEASURE_S after one untimed step. Draws nothing from the run's random streams."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = GPT(model_cfg, vocab_size).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(vocab_size, (batch_size, model_cfg.block_size), device=device)

        def step() -> None:
            with autocast(device, dtype):
                _, loss = model(x, x)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        step()
        steps, start = 0, time.perf_counter()
        while steps < 2 or time.perf_counter() - start < MEASURE_S:
            step()
            steps += 1
        return steps * x.numel() / (time.perf_counter() - start)


def size_model(cfg: RunConfig, given: Collection[str], task: TextTask, dist: Dist,
               device: torch.device, dtype: torch.dtype) -> RunConfig:
    """`cfg` with the GPT picked for its train.max_time (`pick`) over the task's data, but the
    keys in `given` (the user's); rank 0 says why in one line. Every rank times the rungs and
    takes the slowest rank's rate, so that all pick alike."""
    assert cfg.train.max_time is not None
    train, val = (len(task.data.split(name)) for name in ("train", "val"))
    room, vocab_size = min(train, val) - 1, len(task.vocab)

    def rate(rung: Rung) -> float:
        try:
            speed = measure_rate(rung.model(room), rung.batch_size, vocab_size, device, dtype)
        except torch.OutOfMemoryError:  # a rung too large for the device ends the ladder
            speed = 0.0
        return dist.least(round(speed))

    chosen = pick(cfg.train.max_time, rate, train, vocab_size, room)
    if dist.is_main:
        print(chosen.line(cfg.train.max_time), flush=True)
    lr = cfg.optim.lr if "optim.lr" in given else chosen.rung.lr
    return with_keys(cfg, chosen.keys(given, lr))


def with_keys(cfg: RunConfig, keys: dict[str, Any]) -> RunConfig:
    """`cfg` with dotted `section.key` values replaced (each section checked again)."""
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in keys.items():
        section, key = dotted.split(".")
        sections.setdefault(section, {})[key] = value
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)
                                       for name, values in sections.items()})
