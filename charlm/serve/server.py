"""Running the app under uvicorn: the listening socket (bound by charlm, so a port in use is one
error line and `--port 0` takes a free one), and a graceful stop on SIGTERM or SIGINT: new
requests are refused, streams in flight end within the grace time with finish_reason
"shutdown", and the process returns normally (exit 0). A second Ctrl-C quits at once."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from charlm.core.errors import CharlmError
from charlm.serve.app import shutdown

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening, or the error line that says why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)  # create_server adds the address
        raise CharlmError(f"cannot listen on {host}:{port}: {why}; give another "
                          "--port, or a --host of this machine") from None


class Server(uvicorn.Server):
    """uvicorn's server, whose first stop signal also closes the engine (on a thread: it waits
    for the streams to end) and which does not raise the signal again once it has stopped, as
    uvicorn does, so a stop asked for is a clean exit."""

    def __init__(self, config: uvicorn.Config, closer: threading.Thread):
        super().__init__(config)
        self.closer = closer

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: object) -> None:
        if self.closer.ident is None:
            self.closer.start()
        super().handle_exit(sig, frame)


def serve(app: FastAPI, sock: socket.socket, grace_s: float) -> None:
    """Serve `app` on `sock` until a stop signal, then stop as the module docstring says."""
    closer = threading.Thread(target=shutdown, args=(app, grace_s), name="charlm-shutdown",
                              daemon=True)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                            timeout_graceful_shutdown=grace_s + 2)
    Server(config, closer).run(sockets=[sock])
    if closer.ident is None:  # uvicorn ended without a signal: close the engine all the same
        closer.start()
    closer.join()
