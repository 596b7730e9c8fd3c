"""Models sized to a time budget: `charlm train TEXT --time 10m` without a config picks the
largest GPT of `LADDER` (for pairs, the encoder-decoder of `PAIR_LADDER`) whose tokens in the
budget, at this machine's measured speed, reach TOKENS_PER_PARAMETER times its parameters; the
keys the user set win over the pick (docs/design.md, "Models sized to the budget")."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Collection
from typing import Any

import torch

from charlm.config.schema import RunConfig
from charlm.core.durations import format_duration
from charlm.runtime.distributed import Dist
from charlm.runtime.precision import autocast
from charlm.runtime.profile import train_rate
from charlm.training.tasks import PairsTask, Task, build_model

TOKENS_PER_PARAMETER = 4.0  # fitted: docs/design.md
TRAIN_SHARE = 0.85  # of the budget spent in training steps (start-up and evaluations take the rest)
DROPOUT = ((32.0, 0.2), (16.0, 0.1))  # (epochs from which, dropout); none below the last


@dataclasses.dataclass(frozen=True)
class Rung:
    """One size of a ladder: the model's shape and the batch and learning rate it trains at."""

    n_layer: int  # an encoder-decoder's: each side's depth
    n_embd: int
    n_head: int
    block_size: int | None  # None: an encoder-decoder's, as long as the data's longest pair
    batch_size: int
    lr: float

    def block(self, room: int | None) -> int:
        """Its block cut to `room`, the longest the data allows (None: any); an
        encoder-decoder's is `room`, the longest its pairs need."""
        if self.block_size is None:
            assert room is not None, "an encoder-decoder's block is its data's"
            return room
        return self.block_size if room is None else max(1, min(self.block_size, room))

    def shape(self, room: int | None = None) -> dict[str, Any]:
        """The model keys this rung sets: its size and the architecture the ladder trains."""
        keys: dict[str, Any] = {"n_layer": self.n_layer, "n_embd": self.n_embd,
                                "n_head": self.n_head, "block_size": self.block(room)}
        return keys | (PAIR_STYLE if self.block_size is None else GPT_STYLE)

    def __str__(self) -> str:
        if self.block_size is None:
            return (f"{self.n_layer} + {self.n_layer} x {self.n_embd} "
                    "(encoder + decoder layers x width)")
        return f"{self.n_layer} x {self.n_embd} (layers x width)"


# rotary positions, as the CPU presets have, and the levers that won at equal wall time
# (docs/benchmarks.md, "Levers at equal wall time")
GPT_STYLE = {"pos_encoding": "rope", "activation": "relu2", "logit_softcap": 15.0,
             "bigram": True}
GPT_RECIPE = {"optim.weight_decay": 0.5, "optim.embedding_weight_decay": 0.0,
              "optim.ema": 0.99}
PAIR_STYLE = {"arch": "encoder_decoder", "pos_encoding": "sinusoidal",  # the G2P preset's
              "label_smoothing": 0.1, "activation": "relu2", "logit_softcap": 15.0}
PAIR_RECIPE = {"optim.weight_decay": 0.01, "optim.warmup_iters": 300,  # the G2P preset's too
               "optim.ema": 0.99, "train.eval_interval": 1000, "train.eval_iters": 10}
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
PAIR_LADDER = (  # the second is configs/g2p_cmudict.yaml's shape
    Rung(2, 96, 4, None, 128, 3e-3),
    Rung(3, 128, 4, None, 128, 3e-3),
    Rung(3, 192, 4, None, 128, 2e-3),
    Rung(4, 256, 4, None, 128, 1.5e-3),
    Rung(6, 384, 6, None, 128, 1e-3),
    Rung(6, 512, 8, None, 128, 8e-4),
)


@dataclasses.dataclass
class Pick:
    """The rung picked, with what the rule saw."""

    rung: Rung
    rate: float
    tokens: float
    params: int
    epochs: float
    block_size: int
    next_ratio: float | None  # the next rung's tokens a parameter (None: the ladder's top)
    aside: int = 0  # the parameters of a bigram table, which the rule does not count

    @property
    def dropout(self) -> float:
        return next((p for epochs, p in DROPOUT if self.epochs >= epochs), 0.0)

    def keys(self, given: Collection[str], lr: float) -> dict[str, Any]:
        """The config keys of the pick, less those the user set; `lr`: the run's peak rate
        (the user's, if set), whose tenth min_lr is."""
        keys = rung_keys(self.rung, self.block_size) | {
            "model.dropout": self.dropout, "optim.lr": self.rung.lr, "optim.min_lr": lr / 10}
        return {k: v for k, v in keys.items() if k not in given}

    def line(self, seconds: float) -> str:
        data = "pairs" if self.rung.block_size is None else "text"
        why = (f"{self.tokens / self.params:.1f} tokens a parameter, {self.epochs:.1f} epochs "
               f"of the training {data}; the next size up would get "
               f"{self.next_ratio:.1f} a parameter, the rule wants {TOKENS_PER_PARAMETER:g}"
               if self.next_ratio is not None else "the largest size charlm picks")
        table = f" and a {self.aside / 1e6:.2f}M bigram table" if self.aside else ""
        return (f"model sized to {format_duration(seconds)}: {self.rung}, "
                f"block {self.block_size}, {self.params / 1e6:.2f}M parameters{table}, dropout "
                f"{self.dropout:g}: at {self.rate:,.0f} tok/s measured here it trains on "
                f"{self.tokens / 1e6:.1f}M tokens, {why} (a config or --set overrides)")


def rung_keys(rung: Rung, room: int | None) -> dict[str, Any]:
    """The config keys of a rung's model, batch and recipe, its block cut to `room`."""
    keys = {f"model.{k}": v for k, v in rung.shape(room).items()}
    keys["train.batch_size"] = rung.batch_size
    return keys | (PAIR_RECIPE if rung.block_size is None else GPT_RECIPE)


def pick(seconds: float, rate: Callable[[Rung], float], train_tokens: int,
         count: Callable[[Rung], int], room: int | None = None,
         ladder: tuple[Rung, ...] = LADDER) -> Pick:
    """The rung of `ladder` for a budget of `seconds`: `rate(rung)`, its measured tokens/s, is
    asked from the smallest rung up until the rule stops (the smallest when none passes);
    `count(rung)`: its parameters; `room`: as for `Rung.block`."""
    chosen: Pick | None = None
    for rung in ladder:
        params = count(rung)
        speed = rate(rung)
        tokens = speed * TRAIN_SHARE * seconds
        if chosen is not None and tokens < TOKENS_PER_PARAMETER * params:
            chosen.next_ratio = tokens / params
            return chosen
        chosen = Pick(rung, speed, tokens, params, tokens / max(train_tokens, 1),
                      rung.block(room), None)
    assert chosen is not None
    return chosen


def bigram_table(task: Task) -> int:
    """The parameters of the task's bigram table, which the rule does not count: a lookup of
    one row a token costs a step little compute (nanochat's fits count the matrices and head)."""
    m = task.cfg.model
    return (len(task.vocab) + 1) * len(task.vocab) * m.n_embd if m.bigram else 0


def measure_rate(task: Task, device: torch.device, dtype: torch.dtype) -> float:
    """Training tokens a second of the task's model and batch here: AdamW steps on random ids
    shaped like its batches. Draws nothing from the run's random streams."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_model(task.cfg, task.vocab).to(device)
        batch = task.random_batch(task.cfg.train.batch_size, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step() -> None:
            with autocast(device, dtype):
                _, loss = model(*batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return train_rate(step, sum(x.numel() for x in batch[:-1]), device)  # but the targets


def size_model(cfg: RunConfig, given: Collection[str], task: Task, dist: Dist,
               device: torch.device, dtype: torch.dtype) -> RunConfig:
    """`cfg` with the model `pick` chooses for its train.max_time, but the keys in `given` (the
    user's). Every rank times the rungs and takes the slowest rank's rate, so all pick alike."""
    assert cfg.train.max_time is not None
    room = task.room()

    @functools.cache
    def trial(rung: Rung) -> Task:  # the task with the rung's model, as the user has it
        keys = {k: v for k, v in rung_keys(rung, room).items() if k not in given}
        return type(task)(with_keys(cfg, keys), task.data)

    def rate(rung: Rung) -> float:  # said as it goes: the larger rungs take a while to time
        if dist.is_main:
            print(f"sizing the model to {format_duration(cfg.train.max_time)}: timing "
                  f"{rung} ...", end="", flush=True)
        try:
            speed = measure_rate(trial(rung), device, dtype)
        except torch.OutOfMemoryError:  # a rung too large for the device ends the ladder
            speed = 0.0
        speed = dist.least(round(speed))
        if dist.is_main:
            print(f" {speed:,.0f} tok/s", flush=True)
        return speed

    ladder = PAIR_LADDER if isinstance(task, PairsTask) else LADDER
    chosen = pick(cfg.train.max_time, rate, task.train_tokens(),
                  lambda rung: trial(rung).parameter_count() - bigram_table(trial(rung)),
                  room, ladder)
    chosen.aside = bigram_table(trial(chosen.rung))
    lr = cfg.optim.lr if "optim.lr" in given else chosen.rung.lr
    if dist.is_main:  # the keys the user set that the pick would have: the run trains theirs
        theirs = sorted(set(chosen.keys((), lr)) & set(given))
        print(chosen.line(cfg.train.max_time) +
              (f"; the keys you set win: {', '.join(theirs)}" if theirs else ""), flush=True)
    return with_keys(cfg, chosen.keys(given, lr))


def with_keys(cfg: RunConfig, keys: dict[str, Any]) -> RunConfig:
    """`cfg` with dotted `section.key` values replaced (each section checked again)."""
    sections: dict[str, dict[str, Any]] = {}
    for dotted, value in keys.items():
        section, key = dotted.split(".")
        sections.setdefault(section, {})[key] = value
    return dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **values)
                                       for name, values in sections.items()})
