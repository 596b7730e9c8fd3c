"""The OpenAI-compatible HTTP app of `charlm serve` (FastAPI). It never runs torch on its event
loop: the engine decodes on its own thread and its events arrive through a `Mailbox`. A stream
writes every event waiting at once, so a loop that falls behind catches up in fewer writes."""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from charlm.core.errors import CharlmError
from charlm.serve import responses, schema
from charlm.serve.engine import Engine
from charlm.serve.metrics import CONTENT_TYPE, CountResponses, Metrics
from charlm.serve.request import Params
from charlm.serve.schema import ApiError

ENDPOINTS = ("/", "/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions")
OPEN_PATHS = ("/health", "/")  # no key: a load balancer's probe; the page, which holds no data
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat's is the server's cap


@dataclass(frozen=True)
class Settings:
    model: str  # the name /v1/models lists and every answer carries
    limits: schema.Limits = schema.Limits()
    api_key: str | None = None  # when set, every path but OPEN_PATHS needs `Bearer KEY`
    cors_origins: tuple[str, ...] = ()  # browsers' origins allowed to call the API


def create_app(engine: Engine, settings: Settings) -> FastAPI:
    """The app around `engine`, already started."""
    app = FastAPI(title="charlm", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.settings = engine, settings
    app.state.metrics, app.state.in_flight, app.state.closing = Metrics(engine), 0, False
    app.state.mailbox = None  # made on the event loop by the first request (`respond`)
    install_error_handlers(app)
    # the last added runs first: CORS answers a browser's preflight before the key is asked for
    app.add_middleware(Guard, api_key=settings.api_key, body_limit=settings.limits.body)
    app.add_middleware(CountResponses, metrics=app.state.metrics, endpoints=ENDPOINTS)
    if settings.cors_origins:  # any request header: clients add their own (x-stainless-*)
        app.add_middleware(Cors, allow_origins=list(settings.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"],
                           expose_headers=["Retry-After"])
    page = resources.files("charlm.serve").joinpath("page.html")
    html = page.read_text(encoding="utf-8") if page.is_file() else None

    @app.get("/")
    async def playground() -> HTMLResponse:
        if html is None:
            raise ApiError(404, "the playground page (charlm/serve/page.html) is not installed")
        return HTMLResponse(html)

    @app.get("/health")
    async def health() -> JSONResponse:
        s = engine.stats()
        body = {"status": "shutting_down" if app.state.closing else "ok",
                "ready": not app.state.closing, "queued": s.queued,
                "slots": {"total": s.slots, "busy": s.busy, "free": s.slots - s.busy}}
        return JSONResponse(body, 503 if app.state.closing else 200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(app.state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": settings.model, "object": "model",
                                            "created": int(time.time()), "owned_by": "charlm",
                                            "max_logprobs": engine.max_logprobs}]}

    @app.post("/v1/completions")
    async def completions(body: schema.CompletionRequest, request: Request) -> Response:
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        jobs = schema.jobs_for(prompts, body, settings.limits, COMPLETION_MAX_TOKENS,
                               body.logprobs, (), "prompt")
        style = responses.CompletionStyle(settings.model, body.logprobs is not None)
        return await respond(request, style, jobs, body, "prompt", echo=body.echo)

    @app.post("/v1/chat/completions")
    async def chat(body: schema.ChatRequest, request: Request) -> Response:
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        default_max_tokens = (settings.limits.max_tokens if body.max_completion_tokens is None
                              else body.max_completion_tokens)
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        jobs = schema.jobs_for([body.prompt()], body, settings.limits, default_max_tokens,
                               logprobs, schema.CHAT_STOPS, "messages")
        style = responses.ChatStyle(settings.model, body.logprobs)
        return await respond(request, style, jobs, body, "messages")

    return app


def shutdown(app: FastAPI, grace_s: float) -> None:
    """Refuse new requests (503), end those in flight within grace_s; blocks: off the loop."""
    app.state.closing = True
    app.state.engine.close(grace_s)


async def respond(request: Request, style: responses.Style, jobs: list[tuple[str, Params]],
                  body: schema.Sampling, prompt_param: str, echo: bool = False) -> Response:
    """Admit the request (429 past --max-concurrent) and answer it whole or as a stream."""
    state = request.app.state
    if state.closing:
        raise ApiError(503, "the server is shutting down; retry on another one",
                       code="shutting_down")
    limit = state.settings.limits.concurrent
    if state.in_flight + len(jobs) > limit:
        raise ApiError(429, f"the server is busy: {state.in_flight} completions in flight, at "
                       f"most {limit}; retry in a second", code="too_many_requests",
                       headers={"Retry-After": "1"})
    loop = asyncio.get_running_loop()
    if state.mailbox is None or state.mailbox.loop is not loop:  # tests run an app on several
        state.mailbox = responses.Mailbox(loop)
    try:
        completions = responses.Completions(state.engine, jobs, state.metrics, state.mailbox, echo)
    except CharlmError as e:  # the prompt's fault, unless it names another field
        raise ApiError(400, str(e), getattr(e, "param", prompt_param)) from None
    state.in_flight += len(jobs)
    watcher = asyncio.create_task(cancel_on_disconnect(request, completions))

    def done() -> None:
        state.in_flight -= len(jobs)
        watcher.cancel()
        completions.cancel()

    prompt_characters = sum(len(prompt) for prompt, _ in jobs[::body.n])  # n jobs per prompt
    if body.stream:
        return StreamingResponse(
            stream(style, completions, prompt_characters, body.include_usage, done),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        async for _ in completions.events():  # each event added to its choice
            pass
    finally:
        done()
    choices = completions.choices
    if (failed := next((c for c in choices if c.finish_reason == "error"), None)) is not None:
        raise generation_failed(failed.error)
    return JSONResponse(style.body([style.whole(c) for c in choices],
                                   responses.usage(prompt_characters, choices)))


async def stream(style: responses.Style, completions: responses.Completions,
                 prompt_characters: int, include_usage: bool,
                 done: Callable[[], None]) -> AsyncIterator[str]:
    """The server-sent events of a streamed answer, ending with `data: [DONE]`."""
    sse = responses.sse
    try:
        for c in completions.choices:
            if (opening := style.opening(c)) is not None:
                yield sse(style.body([opening], chunk=True))
        async for ready in completions.events():  # one write for the events that have arrived
            if chunks := "".join(sse(style.body([style.delta(c, event, offset)], chunk=True))
                                 for c, event, offset in ready if event.finish_reason != "error"):
                yield chunks
            if failed := [e for _, e, _ in ready if e.finish_reason == "error"]:
                yield sse(generation_failed(failed[0].error).body)  # the headers said 200
                break
        else:
            if include_usage:
                usage = responses.usage(prompt_characters, completions.choices)
                yield sse(style.body([], usage, chunk=True))
        yield responses.DONE
    finally:
        done()


def generation_failed(error: str | None) -> ApiError:
    """A completion the engine could not finish: a 500, or in a stream an error event."""
    return ApiError(500, f"the completion failed: {error or 'see the server log'}",
                    code="generation_failed")


async def cancel_on_disconnect(request: Request, completions: responses.Completions) -> None:
    """Cancel the completions once the client goes away (the next message, the body read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    completions.cancel()


class Cors(CORSMiddleware):
    """Starlette's CORS middleware, a refused preflight in OpenAI's error body, not plain text."""

    def preflight_response(self, request_headers: Any) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        what = bytes(response.body).decode().removeprefix("Disallowed CORS ")
        message = (f"CORS preflight refused: its {what} is not allowed (this server answers "
                   "the origins of its --cors-origin, with GET and POST)")
        kept = {k: v for k, v in response.headers.items()
                if k.startswith("access-control-") or k == "vary"}
        return answer(ApiError(400, message, code="cors_refused", headers=kept))


class Guard:
    """ASGI middleware: the API key (in constant time) and the cap on a body's bytes."""

    def __init__(self, app: Any, api_key: str | None, body_limit: int):
        self.app, self.body_limit = app, body_limit
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.expected is not None and scope["path"] not in OPEN_PATHS and not \
                hmac.compare_digest(headers.get(b"authorization", b""), self.expected):
            refusal = ApiError(401, "this server needs an API key: send the header "
                               "'Authorization: Bearer KEY'", code="invalid_api_key",
                               headers={"WWW-Authenticate": "Bearer"})
            await answer(refusal)(scope, receive, send)
            return
        too_large = (f"the request body is larger than this server's {self.body_limit} bytes "
                     "(its --max-body)")
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.body_limit:
            await answer(ApiError(413, too_large))(scope, receive, send)
            return
        received = 0

        async def limited() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.body_limit:
                raise HTTPException(413, too_large)
            return message

        await self.app(scope, limited, send)


def answer(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body, e.status, headers=e.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal in OpenAI's error body, never a traceback."""

    @app.exception_handler(ApiError)
    async def refused(request: Request, e: ApiError) -> JSONResponse:
        return answer(e)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        return answer(schema.validation_error(e))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        message = e.detail if e.status_code == 413 else (
            f"{e.detail}: {request.method} {request.url.path}")
        return answer(ApiError(e.status_code, message))

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception) -> JSONResponse:
        return answer(ApiError(500, f"internal error ({type(e).__name__}); the server's log "
                               "has the details"))
