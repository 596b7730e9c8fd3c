"""The OpenAI bodies `charlm serve` answers with, whole or as stream chunks, each choice built
up from the engine's events, with each endpoint's logprobs."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from charlm.serve.request import Event

DONE = "data: [DONE]\n\n"


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


@dataclass
class Choice:
    """One completion as its events arrive."""

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
    """What differs between /v1/completions and /v1/chat/completions."""

    object = chunk_object = id_prefix = ""

    def __init__(self, model: str, logprobs: bool):
        self.model, self.logprobs = model, logprobs
        self.id, self.created = f"{self.id_prefix}{uuid.uuid4().hex}", int(time.time())

    def body(self, choices: list[dict], usage: dict | None = None, chunk: bool = False) -> dict:
        body = {"id": self.id, "object": self.chunk_object if chunk else self.object,
                "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    def opening(self, c: Choice) -> dict | None:
        """A stream's first chunk of a choice, before its events; None for none."""
        return None

    def whole(self, c: Choice) -> dict:
        raise NotImplementedError

    def delta(self, c: Choice, event: Event, offset: int) -> dict:
        raise NotImplementedError


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
