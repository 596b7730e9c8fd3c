"""Running the app under uvicorn: the socket charlm binds (a port in use is one error line), bounds
on what one client may hold of its connections (uvicorn waits for a request as long as its client
likes), and a graceful stop on SIGTERM or SIGINT that exits 0; a second Ctrl-C quits."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import threading
import time

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

from charlm.core.errors import CharlmError, warn
from charlm.serve.app import answer, shutdown
from charlm.serve.schema import ApiError

try:
    import resource  # POSIX
except ImportError:  # pragma: no cover - Windows has no descriptor limit to fit in
    resource = None

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
RESERVED_FILES = 32  # the listening socket, the event loop's own, checkpoints, stdio
ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message for EMFILE and kin
BUSY_WAIT_S = 1.0  # a connection past the cap: time for its request to come for its 503
WARN_INTERVAL_S = 60.0  # one warning line a minute while accept() keeps failing


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, or the error line why not. Its connections inherit
    TCP_NODELAY (uvicorn sets none on a given socket; small writes waited for a delayed ACK)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        if e.errno is not None and e.errno < 0:  # getaddrinfo's (os.strerror: "Unknown error")
            raise CharlmError(f"cannot listen on {host}:{port}: {host} is neither an IP address "
                              "nor a host name that resolves; give a --host of this machine "
                              "(127.0.0.1, 0.0.0.0, ::1)") from None
        why = os.strerror(e.errno) if e.errno else str(e)  # create_server adds the address
        raise CharlmError(f"cannot listen on {host}:{port}: {why}; give another "
                          "--port, or a --host of this machine") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def serve(app: FastAPI, sock: socket.socket, grace_s: float, request_timeout: float = 10.0,
          max_connections: int = 512) -> None:
    """Serve `app` on `sock` until a stop signal. uvicorn runs on a thread of its own; the
    engine decodes on this one, the main thread (`Engine.run`), where the signals arrive."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                            timeout_graceful_shutdown=grace_s + 2,
                            http=protocol(request_timeout, connection_cap(max_connections)))
    server = uvicorn.Server(config)  # off the main thread it installs no signal handlers
    closer = threading.Thread(target=shutdown, args=(app, grace_s), name="charlm-shutdown",
                              daemon=True)

    once = threading.Lock()

    def close_once() -> None:
        with once:
            if closer.ident is None:
                closer.start()

    async def http() -> None:
        quiet_accept_errors(asyncio.get_running_loop())
        await server.serve(sockets=[sock])

    def http_then_close() -> None:  # however uvicorn ends, the engine's loop ends after it
        try:
            asyncio.run(http())
        finally:
            close_once()

    thread = threading.Thread(target=http_then_close, name="charlm-http", daemon=True)

    def stop(sig: int, frame: object) -> None:
        if server.should_exit and sig == signal.SIGINT:  # a second Ctrl-C: at once
            server.force_exit = True
            os._exit(130)
        server.should_exit = True
        close_once()

    before = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        thread.start()
        app.state.engine.run()  # until `shutdown` closes the engine
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        server.should_exit = True
        thread.join(grace_s + 5)


def protocol(request_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol, bounded: a request not whole within `request_timeout` seconds of
    connecting or of the previous answer is answered 408 and closed; a connection past
    `max_connections` is answered 503 and closed, within BUSY_WAIT_S."""
    # a whole HTTP/1.1 answer that closes its connection, as bytes to write past h11
    timeout_body = answer(ApiError(
        408, f"the request did not arrive whole within {request_timeout:g} s (the server's "
        "--request-timeout); send it again, faster", code="request_timeout")).body
    timeout_answer = ("HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                      f"content-length: {len(timeout_body)}\r\nconnection: close\r\n\r\n"
                      ).encode() + timeout_body
    busy = answer(ApiError(503, f"the server has {max_connections} connections open, its "
                           "--max-connections; retry in a second", code="too_many_connections",
                           headers={"Retry-After": "1", "Connection": "close"}))

    class Bounded(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            wait = request_timeout
            if len(self.connections) > max_connections:
                self.app = busy  # uvicorn runs self.app for each request on this connection
                wait = min(wait, BUSY_WAIT_S)
            self.deadline = self.loop.call_later(wait, self.timed_out)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):  # the request is whole
                self.deadline.cancel()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.deadline.cancel()  # the next request's time runs from this answer
                self.deadline = self.loop.call_later(request_timeout, self.timed_out)

        def connection_lost(self, exc: Exception | None) -> None:
            self.deadline.cancel()
            super().connection_lost(exc)

        def timed_out(self) -> None:
            if self.transport.is_closing():
                return
            started = self.conn.their_state is h11.SEND_BODY or self.conn.trailing_data[0]
            if started and self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):  # unanswered
                self.transport.write(timeout_answer)
            self.transport.close()

    return Bounded


def connection_cap(requested: int) -> int:
    """`requested` connections, or fewer to fit the open-files limit beside RESERVED_FILES (one
    past the cap is answered 503; one past the limit could not even be accepted)."""
    if resource is None:
        return requested
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or requested + RESERVED_FILES <= soft:
        return requested
    fits = max(1, soft - RESERVED_FILES)
    warn(f"--max-connections {requested} lowered to {fits}: this process may open {soft} files "
         "(ulimit -n); raise that limit to hold more")
    return fits


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Make an accept() that fails for want of descriptors one warning line a minute on `loop`,
    not asyncio's traceback for every try (once per pending connection per loop pass)."""
    last = -math.inf

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        nonlocal last
        if context.get("message") != ACCEPT_FAILED:
            loop.default_exception_handler(context)
        elif time.monotonic() - last >= WARN_INTERVAL_S:
            last = time.monotonic()
            warn(f"cannot accept connections: {context['exception'].strerror}; they wait until "
                 "open ones close (see --max-connections, --request-timeout and ulimit -n)")

    loop.set_exception_handler(handle)
