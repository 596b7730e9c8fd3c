"""Running the app under uvicorn on a socket charlm binds (a port in use is one error line), and
a graceful stop on SIGTERM or SIGINT: new requests are refused, those in flight end within the
grace time with finish_reason "shutdown", and the process exits 0. A second Ctrl-C quits."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading

import uvicorn
from fastapi import FastAPI

from charlm.core.errors import CharlmError
from charlm.serve.app import shutdown
from charlm.serve.connections import connection_cap, protocol, quiet_accept_errors

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
