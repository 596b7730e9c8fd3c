"""The engine's events on their way to an HTTP answer (`Mailbox`, `Completions`) and the OpenAI
bodies built from them, whole or as stream chunks, with each endpoint's logprobs."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from charlm.serve.engine import Engine
from charlm.serve.request import Event, Params, Request

if TYPE_CHECKING:  # for annotations only: the engine's tests run without prometheus_client
    from charlm.serve.metrics import Metrics

DONE = "data: [DONE]\n\n"


class Mailbox:
    """`post` queues an item for an asyncio.Queue from any thread and wakes the loop only if no
    wake-up is pending, so one wake-up delivers a whole decode step's events."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list[tuple[asyncio.Queue, Any]] = []
        self.pending = False  # a wake-up is on its way

    def post(self, queue: asyncio.Queue, item: Any) -> None:  # on any thread
        with self.lock:
            self.items.append((queue, item))
            if self.pending:
                return
            self.pending = True
        try:
            self.loop.call_soon_threadsafe(self.deliver)
        except RuntimeError:  # the loop has closed: nobody waits any more
            with self.lock:
                self.items.clear()
                self.pending = False

    def deliver(self) -> None:  # on the loop
        with self.lock:
            items, self.items, self.pending = self.items, [], False
        for queue, item in items:
            queue.put_nowait(item)


class Completions:
    """The engine requests behind one HTTP request, their events in one queue, timed, and the
    choices they build (a completion's starts with its prompt under `echo`)."""

    def __init__(self, engine: Engine, jobs: list[tuple[str, Params]], metrics: Metrics,
                 mailbox: Mailbox, echo: bool = False):
        self.metrics = metrics
        self.choices = [Choice(i, prompt if echo else "") for i, (prompt, _) in enumerate(jobs)]
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.requests: list[Request] = []
        self.start = time.monotonic()

        def on_event(i: int, event: Event) -> None:  # on the engine's thread
            mailbox.post(self.queue, (i, event))

        try:
            for i, (prompt, params) in enumerate(jobs):
                self.requests.append(engine.submit(prompt, params, functools.partial(on_event, i)))
        except BaseException:
            self.cancel()
            raise

    async def events(self) -> AsyncIterator[list[tuple[Choice, Event, int]]]:
        """Every (choice, event, the offset of its text in the choice's) that has arrived, the
        event added to its choice, until every choice has ended."""
        last: dict[int, float] = {}
        while any(c.finish_reason is None for c in self.choices):
            ready = [await self.queue.get()]
            while not self.queue.empty():
                ready.append(self.queue.get_nowait())
            now = time.monotonic()
            for i, event in ready:
                if event.text:
                    if i in last:
                        self.metrics.per_character.observe((now - last[i]) / len(event.text))
                    else:
                        self.metrics.first_character.observe(now - self.start)
                    last[i] = now
            yield [(self.choices[i], event, self.choices[i].add(event)) for i, event in ready]

    def cancel(self) -> None:
        """Free the slots of the choices still going."""
        for request, c in zip(self.requests, self.choices, strict=False):  # those submitted
            if c.finish_reason is None:
                request.cancel()


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


@dataclass
class Choice:
    index: int
    echo: str = ""
    text: str = ""
    scored: list[Event] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None  # with finish_reason "error"
    tokens: int = 0  # output tokens generated: what max_tokens counts

    def add(self, event: Event) -> int:
        """Take one event; the offset of its text in the choice's."""
        offset = len(self.echo) + len(self.text)
        self.text += event.text
        self.tokens += len(event.text) if event.tokens is None else event.tokens
        if event.logprob is not None and event.text:
            self.scored.append(event)
        if event.finish_reason is not None:
            self.finish_reason, self.error = event.finish_reason, event.error
        return offset


class Style:
    """What differs between /v1/completions and /v1/chat/completions: each subclass's names,
    and its `opening` chunk of a stream's choice, `whole` choice and stream `delta`."""

    object = chunk_object = id_prefix = ""  # each subclass's

    def __init__(self, model: str, logprobs: bool):
        self.model, self.logprobs = model, logprobs
        self.id, self.created = f"{self.id_prefix}{uuid.uuid4().hex}", int(time.time())

    def body(self, choices: list[dict], usage: dict | None = None, chunk: bool = False) -> dict:
        body = {"id": self.id, "object": self.chunk_object if chunk else self.object,
                "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body


def usage(prompt_characters: int, choices: list[Choice]) -> dict[str, int]:
    """OpenAI's `usage`: the prompts' characters and the output tokens, as max_tokens counts."""
    completion = sum(c.tokens for c in choices)
    return {"prompt_tokens": prompt_characters, "completion_tokens": completion,
            "total_tokens": prompt_characters + completion}


class CompletionStyle(Style):
    object = chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def scores(self, events: list[Event], offset: int) -> dict | None:
        if not self.logprobs:
            return None
        offsets = list(itertools.accumulate((len(e.text) for e in events), initial=offset))
        return {"tokens": [e.text for e in events], "token_logprobs": [e.logprob for e in events],
                "top_logprobs": [e.top for e in events], "text_offset": offsets[:-1]}

    def opening(self, c: Choice) -> dict | None:
        if not c.echo:
            return None
        return {"index": c.index, "text": c.echo, "logprobs": None, "finish_reason": None}

    def whole(self, c: Choice) -> dict:
        return {"index": c.index, "text": c.echo + c.text,
                "logprobs": self.scores(c.scored, len(c.echo)), "finish_reason": c.finish_reason}

    def delta(self, c: Choice, event: Event, offset: int) -> dict:
        scored = [event] if event.logprob is not None and event.text else []
        return {"index": c.index, "text": event.text, "logprobs": self.scores(scored, offset),
                "finish_reason": event.finish_reason}


def chat_entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


class ChatStyle(Style):
    object, chunk_object = "chat.completion", "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def scores(self, events: list[Event]) -> dict | None:
        if not self.logprobs:
            return None
        return {"content": [{**chat_entry(e.text, e.logprob),
                             "top_logprobs": [chat_entry(t, lp) for t, lp in (e.top or {}).items()]}
                            for e in events]}

    def opening(self, c: Choice) -> dict:
        return {"index": c.index, "delta": {"role": "assistant", "content": ""},
                "logprobs": None, "finish_reason": None}

    def whole(self, c: Choice) -> dict:
        return {"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": self.scores(c.scored), "finish_reason": c.finish_reason}

    def delta(self, c: Choice, event: Event, offset: int) -> dict:
        scored = [event] if event.logprob is not None and event.text else []
        return {"index": c.index, "delta": {"content": event.text} if event.text else {},
                "logprobs": self.scores(scored), "finish_reason": event.finish_reason}
