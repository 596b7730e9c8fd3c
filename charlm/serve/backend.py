"""What the serving app asks of an engine (`Backend`), and the slots `charlm serve` gives it by
default; apart from the engine, so the app and a test's fake engine need only this."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from charlm.core.errors import CharlmError
from charlm.model.attention import attention_dtype
from charlm.model.encoder_decoder import EncoderDecoder
from charlm.model.footprint import cache_bytes
from charlm.model.gpt import GPT
from charlm.serve.request import Event, Params, Request

KV_BUDGET = 1 << 30  # bytes of keys and values that `charlm serve`'s default slots fit in


def slots_within(model: GPT | EncoderDecoder, budget: int, most: int) -> int:
    """The most slots, from one up to `most`, whose KV caches fit in `budget` bytes."""
    return max(1, min(most, budget // slot_bytes(model)))


def slot_bytes(model: GPT | EncoderDecoder) -> int:
    """One slot's KV cache, in the dtype attention computes in."""
    return cache_bytes(model.cfg, 1, attention_dtype(model.wte.weight).itemsize)


class FieldError(CharlmError):
    """A request refused for a field other than the prompt (the HTTP error's `param`)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Stats:
    slots: int
    busy: int
    queued: int
    batch_size: int  # rows in the last decode step
    characters: int  # generated in all


class Backend(Protocol):
    """What the app and its metrics ask of an engine: `Engine`, or a test's fake one."""

    # the most logprobs a request may ask for (0: the chosen characters' only; None: none at
    # all), which the page asks /v1/models for
    max_logprobs: int | None

    def submit(self, prompt: str, params: Params,
               on_event: Callable[[Event], None]) -> Request: ...

    def stats(self) -> Stats: ...

    def close(self, grace_s: float = 5.0) -> None: ...
