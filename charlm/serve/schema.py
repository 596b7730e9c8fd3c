"""The OpenAI shapes `charlm serve` reads (the request bodies, with vLLM's `top_k`, `min_p` and
`repetition_penalty` at the top level), the server's limits, the chat template, and OpenAI's
error body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from charlm.config.sampling import MAX_TEMPERATURE
from charlm.core.errors import suggest
from charlm.serve.request import MAX_LOGPROBS, Params

MAX_STOPS = 4  # stop strings per request, as OpenAI allows
MAX_STOP_CHARS = 1000  # characters of one stop string: a request's text cannot end with more
ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}
CHAT_STOPS = tuple(f"\n{name}:" for name in ROLES.values())  # the next turn ends a reply


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how much the server takes at once."""

    prompt: int = 16_384  # characters of one prompt (a chat's after its template)
    max_tokens: int = 4_096  # output tokens one completion may generate (characters, units)
    n: int = 16  # completions one request asks for: prompts x n
    body: int = 1 << 20  # bytes of a request body
    concurrent: int = 64  # completions in flight; a request beyond them gets 429


# OpenAI's fields charlm has no use for (LangChain sends them) -> (the one value served, refusal)
NO_PENALTY = ("only 0 is served (charlm has no such penalty); use repetition_penalty, or leave "
              "it out")
NEUTRAL = {
    "frequency_penalty": (0, NO_PENALTY),
    "presence_penalty": (0, NO_PENALTY),
    "logit_bias": ({}, "only {} is served (the ids are the model's characters, not OpenAI's "
                   "tokens); leave it out"),
    "best_of": (1, "only 1 is served (each completion is returned); ask for n completions "
                "instead"),
    "suffix": ("", "only null is served (a GPT continues a prompt; it does not fill in before a "
               "suffix); leave it out"),
}

ERROR_TYPES = {401: "authentication_error", 429: "rate_limit_error"}


class ApiError(Exception):
    """A request the server refuses: its status, OpenAI's error body and extra headers."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.status, self.headers = status, headers
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_error(e: ValidationError | Any) -> ApiError:
    """Pydantic's first complaint about a body as one 400 error naming its field; an unknown
    field first, since a misspelt one is also reported as a missing one."""
    errors = e.errors()
    error = next((x for x in errors if x["type"] == "extra_forbidden"), errors[0])
    loc = [str(part) for part in error["loc"] if part != "body"]
    param = ".".join(loc) or None
    if error["type"] == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {error['ctx']['error']}")
    if error["type"] == "extra_forbidden":
        return ApiError(400, f"unknown field '{param}'{_nearest(loc)}", param)
    if not loc and isinstance(error.get("input"), (bytes, str)):  # not read as JSON at all
        return ApiError(400, "the body was not read as JSON: send it with the header "
                        "Content-Type: application/json")
    if not loc:
        return ApiError(400, f"the body must be a JSON object: {error['msg']}")
    return ApiError(400, f"{param}: {error['msg']}", param)


def _nearest(loc: list[str]) -> str:
    """What to say after an unknown field: the other endpoint's it is, or the nearest name."""
    name = loc[-1]
    if len(loc) == 1:
        for path, fields, other in ((COMPLETIONS, CHAT_FIELDS, CompletionRequest),
                                    (CHAT, COMPLETION_FIELDS, ChatRequest)):
            if name in other.model_fields and name not in fields:
                return f": it is a field of {path}, not of this endpoint"
    return suggest(name, [f for f in FIELDS if f != name])


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False  # a last chunk with `usage` and no choices


class Sampling(BaseModel):
    """The fields both endpoints share; `max_tokens` is None for the endpoint's default."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None  # one model is served: any name is taken, the answer names it
    max_tokens: int | None = Field(None, ge=0)
    temperature: float = Field(1.0, ge=0, le=MAX_TEMPERATURE)  # 0 is greedy
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # vLLM's -1 (and 0) mean off
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = Field(None, validate_default=True)  # a list after checks
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what torch.Generator takes
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # taken and ignored, as OpenAI's is for abuse reports
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("temperature", "n", "stream", "repetition_penalty", "echo", "logprobs",
                     mode="before", check_fields=False)
    @classmethod
    def _null_is_the_default(cls, value: Any, info: Any) -> Any:
        """null for a field with a default means that default, as OpenAI reads it."""
        return cls.model_fields[info.field_name].default if value is None else value

    @field_validator(*NEUTRAL, check_fields=False)
    @classmethod
    def _neutral(cls, value: Any, info: Any) -> Any:
        neutral, refusal = NEUTRAL[info.field_name]
        if value is not None and value != neutral:
            raise ValueError(refusal)
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if not all(stops):
            raise ValueError("a stop string must not be empty")
        if (longest := max(map(len, stops), default=0)) > MAX_STOP_CHARS:
            raise ValueError(f"a stop string may have at most {MAX_STOP_CHARS:,} characters, "
                             f"got {longest:,}")
        return stops

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(Sampling):
    prompt: str | list[str]
    echo: bool = False  # the choice's text starts with its prompt
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None  # these two at their NEUTRAL values only
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and not prompt:
            raise ValueError("give at least one prompt")
        return prompt

    @field_validator("logprobs")
    @classmethod
    def _no_echoed_logprobs(cls, logprobs: int | None, info: Any) -> int | None:
        if logprobs is not None and info.data.get("echo"):
            raise ValueError("logprobs are given for generated characters only: drop echo, or "
                             "prepend the prompt yourself")
        return logprobs


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = None  # taken and ignored: the template has no place for it


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=0)  # OpenAI's newer max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def prompt(self) -> str:
        """The conversation as the model reads it: a "Role: text" line each, then "Assistant: "."""
        turns = "".join(f"{ROLES[m.role]}: {m.content}\n" for m in self.messages)
        return f"{turns}{ROLES['assistant']}: "


def jobs_for(prompts: list[str], body: Sampling, limits: Limits, default_max_tokens: int,
             logprobs: int | None, stops: tuple[str, ...], prompt_param: str,
             ) -> list[tuple[str, Params]]:
    """Each completion a request asks for, within the limits: every prompt n times, with the
    seeds seed, seed + 1, ... (n samples differ, each reproducible)."""
    for prompt in prompts:
        if len(prompt) > limits.prompt:
            raise ApiError(400, f"the prompt has {len(prompt)} characters, more than this "
                           f"server's {limits.prompt} (its --max-prompt)", prompt_param)
    max_tokens = default_max_tokens if body.max_tokens is None else body.max_tokens
    if max_tokens > limits.max_tokens:
        raise ApiError(400, f"max_tokens is {max_tokens}, more than this server's "
                       f"{limits.max_tokens} (its --max-tokens)", "max_tokens")
    if len(prompts) * body.n > limits.n:
        raise ApiError(400, f"{len(prompts)} prompt(s) x n={body.n} completions, more than this "
                       f"server's {limits.n} per request (its --max-n)", "n")
    # past torch's largest seed the count goes on from its smallest
    seeds = [None if body.seed is None else body.seed + j - (2**64 if body.seed + j >= 2**64 else 0)
             for j in range(body.n)]
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else None
    params = [Params(max_tokens=max_tokens, temperature=body.temperature, top_k=top_k,
                     top_p=body.top_p, min_p=body.min_p,
                     repetition_penalty=body.repetition_penalty,
                     stop=tuple(body.stop) + stops, seed=seed, logprobs=logprobs)
              for seed in seeds]
    return [(prompt, p) for prompt in prompts for p in params]


# Every field a body may hold, for the nearest name to an unknown one
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
COMPLETION_FIELDS = frozenset(CompletionRequest.model_fields)
CHAT_FIELDS = frozenset(ChatRequest.model_fields) | frozenset(Message.model_fields)
FIELDS = sorted(COMPLETION_FIELDS | CHAT_FIELDS)
