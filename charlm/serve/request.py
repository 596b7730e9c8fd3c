"""One request's side of the serving engine: `Params`, `Event`, the handle the app holds
(`Request`) and its row of the batch (`Row`). Logprobs are vLLM's: of the distribution drawn
from (`Sampler.warp`) before top-k, top-p and min-p; -inf is LOGPROB_FLOOR (JSON has no inf)."""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from charlm.config.sampling import SampleConfig
from charlm.core.errors import first_line, warn
from charlm.data.vocab import Vocab
from charlm.generation.text import StopMatcher

LOGPROB_FLOOR = -9999.0
REPETITION_WINDOW = SampleConfig().repetition_window  # as `charlm sample`'s default
MAX_LOGPROBS = 5  # alternatives per character, as OpenAI's completions allow


@dataclass(frozen=True)
class Params:
    """One completion's sampling, validated by the app."""

    max_tokens: int  # characters to generate at most
    temperature: float = 1.0  # 0: greedy
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()  # the completion ends before the first of these (not included)
    seed: int | None = None  # its own torch.Generator: same text alone or in a crowd
    logprobs: int | None = None  # 0..MAX_LOGPROBS: the chosen character's logprob and top-N

    def sampling(self) -> SampleConfig:
        return SampleConfig(max_new_tokens=self.max_tokens, temperature=self.temperature,
                            top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                            repetition_penalty=self.repetition_penalty, stop=self.stop)


@dataclass(frozen=True)
class Event:
    """What a request gets from the engine's thread: one event per character, then one with the
    finish reason ("stop", "length", "cancelled", "shutdown" or "error")."""

    text: str  # characters added ("" on a final event that adds none)
    logprob: float | None = None  # of the chosen character, when Params.logprobs is not None
    top: dict[str, float] | None = None  # the top-N characters and their logprobs
    finish_reason: str | None = None  # None until the last event
    error: str | None = None  # with finish_reason "error"
    tokens: int | None = None  # the output tokens its text holds; None: one a character


class Request:
    """A submitted completion; `cancel` makes it leave the batch at the next step."""

    def __init__(self, ids: list[int], params: Params, on_event: Callable[[Event], None],
                 wake: Callable[[], None]):
        self.ids = ids
        self.params = params
        self.opts = params.sampling()
        self.on_event = on_event
        self.cancelled = False
        self.finished = False
        self._wake = wake

    def cancel(self) -> None:
        self.cancelled = True
        self._wake()

    def send(self, event: Event) -> None:
        """Hand the event to the app; a callback that fails cancels the request, not the engine."""
        try:
            self.on_event(event)
        except Exception as e:
            warn(f"a request's event callback failed ({first_line(e)}); cancelling it")
            self.cancelled = True

    def finish(self, reason: str, error: str | None = None) -> None:
        if not self.finished:
            self.finished = True
            self.send(Event("", finish_reason=reason, error=error))

    def generator(self, device: torch.device) -> torch.Generator:
        generator = torch.Generator(device=device)
        if self.params.seed is None:
            generator.seed()  # a fresh nondeterministic seed
        else:
            generator.manual_seed(self.params.seed)
        return generator


def rounded(logprob: float) -> float:
    return max(logprob, LOGPROB_FLOOR) if not math.isnan(logprob) else LOGPROB_FLOOR


class Row:
    """One request in the batch, beside its `Sampler` row: the characters held back while they
    may start a stop string, and a byte model's logprob of the character begun so far."""

    def __init__(self, request: Request, vocab: Vocab):
        self.request = request
        self.params = request.params
        self.chars = vocab.chars
        self.stream = vocab.stream()
        self.logprob = 0.0
        self.matcher = StopMatcher(self.params.stop, include_stop=False)
        self.held: collections.deque[Event] = collections.deque()
        self.count = 0
        self.last = 0  # the id to feed at the next step
        self.error: str | None = None  # why it cannot go on

    def take(self, token: int, x: torch.Tensor) -> None:
        """Take the drawn id, scored by x (1, V); send the characters that became final."""
        self.last = token
        self.count += 1
        event = self.event(x, token, self.stream.feed(token))
        if event is None:  # a byte of a character still unfinished
            return
        self.held.append(event)
        released = len(self.matcher.feed(event.text))
        for _ in range(released):
            self.request.send(self.held.popleft())

    def event(self, x: torch.Tensor, token: int, text: str) -> Event | None:
        """The event of the character `text` that `token` finished (None inside a byte model's
        character), with its logprob (summed over its bytes) and top-N when asked for."""
        n = self.params.logprobs
        if n is None:
            return Event(text) if text else None
        logprobs = torch.log_softmax(x[0], dim=-1)
        self.logprob += float(logprobs[token])
        if not text:
            return None
        top = logprobs.topk(min(n, logprobs.numel()))
        table = {self.chars[i]: rounded(v)
                 for v, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)}
        logprob, self.logprob = self.logprob, 0.0
        return Event(text, rounded(logprob), table)

    def done(self) -> str | None:
        if self.matcher.done:
            return "stop"
        if self.count >= self.params.max_tokens:
            for event in self.held:  # no stop string can follow: what was held is text
                self.request.send(event)
            self.held.clear()
            return "length"
        return None
