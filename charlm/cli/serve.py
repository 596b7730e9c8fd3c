"""`charlm serve`: a trained model behind an OpenAI-compatible HTTP API (charlm.serve), loaded
once; every request shares the engine's batch. Binds 127.0.0.1 unless --host says otherwise."""

from __future__ import annotations

import ipaddress
import os
from typing import Annotated

import typer

from charlm.cli.options import DeviceOpt, DtypeOpt, TargetArg
from charlm.core.errors import CharlmError, warn

SERVE_MODULES = ("fastapi", "starlette", "pydantic", "uvicorn", "prometheus_client")


def opt(metavar: str, help: str, **kw: object) -> typer.models.OptionInfo:
    return typer.Option(metavar=metavar, help=help, **kw)


def serve(
    target: TargetArg,
    host: Annotated[str, opt("HOST", "Address to listen on; 0.0.0.0 for every network (then "
                             "give --api-key).")] = "127.0.0.1",
    port: Annotated[int, opt("PORT", "Port; 0 takes a free one.", min=0, max=65535)] = 8000,
    api_key: Annotated[str | None, opt(
        "KEY", "Require 'Authorization: Bearer KEY' on every endpoint but /health and the page.",
        envvar="CHARLM_API_KEY", show_default=False)] = None,
    cors_origin: Annotated[list[str] | None, opt(
        "ORIGIN", "A browser origin allowed to call the API (http://host:port); repeatable. "
        "[default: none]")] = None,
    slots: Annotated[int | None, opt(
        "N", "Completions decoded together at most; more wait in a queue. [default: "
        "--max-concurrent's, or fewer if their keys and values would pass 1 GiB]",
        min=1, show_default=False)] = None,
    compile: Annotated[bool, typer.Option(
        "--compile", help="torch.compile the batched decode step at start-up; it prints a "
        "step against an eager one, and says where it is slower.")] = False,
    max_prompt: Annotated[int, opt("N", "Characters of one prompt.", min=1)] = 16_384,
    max_tokens: Annotated[int, opt("N", "Characters one completion may generate (chat's "
                                   "default).", min=1)] = 4_096,
    max_n: Annotated[int, opt("N", "Completions one request may ask for (prompts x n).",
                              min=1)] = 16,
    max_body: Annotated[int, opt("BYTES", "Bytes of a request body.", min=1)] = 1 << 20,
    max_concurrent: Annotated[int, opt("N", "Completions in flight; beyond them 429 with "
                                       "Retry-After.", min=1)] = 64,
    request_timeout: Annotated[float, opt(
        "SECONDS", "Time a client has to send a whole request (head and body) from connecting "
        "or from its previous answer; past it 408 and the connection closes.", min=0.1)] = 10.0,
    max_connections: Annotated[int, opt(
        "N", "Connections open at once; a request on one past them is answered 503 (fewer "
        "if ulimit -n is lower).", min=1)] = 512,
    grace: Annotated[float, opt("SECONDS", "Time streams in flight get to end at SIGTERM or "
                                "Ctrl-C.", min=0)] = 5.0,
    model_name: Annotated[str | None, opt(
        "NAME", "The model's name in the API. [default: the run dir's name]",
        show_default=False)] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
) -> None:
    """Serve a model over HTTP: OpenAI's /v1/completions and /v1/chat/completions (streamed or
    not), /v1/models, /health, /metrics, and a playground page at /."""
    check_exposure(host, api_key)
    if max_n > max_concurrent:
        raise CharlmError(f"--max-n {max_n} is above --max-concurrent {max_concurrent}: a "
                          "request for --max-n completions could never run; lower --max-n")
    try:
        from charlm.serve.app import Settings, create_app
        from charlm.serve.schema import Limits
        from charlm.serve.server import listen, serve
    except ModuleNotFoundError as e:
        if e.name not in SERVE_MODULES:
            raise
        raise CharlmError(f"charlm serve needs the serve extra ({e.name} is missing): "
                          "pip install -e '.[serve]'") from None
    from charlm.api import load
    from charlm.serve.engine import KV_BUDGET, Engine, slots_within

    lm = load(target, device, dtype)  # before the port: a bad run binds nothing
    name = model_name or (target if target.is_dir() else target.parent).resolve().name
    slots = slots or slots_within(lm.model, KV_BUDGET, max_concurrent)
    engine = Engine(lm.model, lm.vocab, slots=slots, compile=compile)
    del lm  # the engine decodes from its own copy: the loaded weights need not stay in memory
    sock = listen(host, port)
    engine.build()  # the engine decodes on this thread once serving (`serve`); says its time
    settings = Settings(name, Limits(max_prompt, max_tokens, max_n, max_body, max_concurrent),
                        api_key, tuple(cors_origin or ()))
    bound_host, bound_port = sock.getsockname()[:2]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if api_key is None and not loopback:
        warn(f"listening on {host} without --api-key: whoever reaches this port can "
             "use the model")
    url = f"http://{f'[{bound_host}]' if ':' in bound_host else bound_host}:{bound_port}"
    print(f"serving {name} on {url} (slots: {engine.slots}; {engine.layout.describe()}; "
          "the API under /v1, the page at /; Ctrl-C stops)",
          flush=True)
    serve(create_app(engine, settings), sock, grace, request_timeout, max_connections)


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse an empty --host (every network to the OS) and an empty key (click reads an empty
    CHARLM_API_KEY as unset: no key at all)."""
    if not host.strip():
        raise CharlmError("--host is empty, which would listen on every network; give an "
                          "address (127.0.0.1, or 0.0.0.0 for every network with --api-key)")
    if api_key == "":
        raise CharlmError("--api-key is empty; give a key, or leave it out")
    if api_key is None and os.environ.get("CHARLM_API_KEY") == "":
        raise CharlmError("CHARLM_API_KEY is set but empty, so the server would need no key; "
                          "give a key in it, or unset it")
