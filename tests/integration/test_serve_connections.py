"""What clients that never finish a request can hold of `charlm serve`, with raw sockets: a
request that stops halfway (in its head or its body) is answered 408 and closed after
--request-timeout; past --max-connections a request is answered 503; sockets past the
open-files limit cost one warning line, not a traceback per accept(), and the server answers
while they are held."""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Served

pytest.importorskip("fastapi")  # the serve extra

pytestmark = pytest.mark.xdist_group("serve")

HALF_HEAD = b"GET /health HTTP/1.1\r\nHost: x\r\n"
HALF_BODY = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 40\r\n\r\n{\"prompt\":")
TIMEOUT_BODY = {"error": {"message": "the request did not arrive whole within 1 s (the "
                          "server's --request-timeout); send it again, faster",
                          "type": "invalid_request_error", "param": None,
                          "code": "request_timeout"}}


def address(served: Served) -> tuple[str, int]:
    host, port = served.url.removeprefix("http://").split(":")
    return host, int(port)


def answer(sock: socket.socket, timeout: float = 30) -> tuple[bytes, dict | None]:
    """The status line and the JSON body the server sends before it closes `sock`."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body) if body else None


def ask(addr: tuple[str, int], request: bytes) -> tuple[bytes, dict | None]:
    sock = socket.create_connection(addr, timeout=30)
    sock.sendall(request)
    return answer(sock)


@pytest.fixture(scope="module")
def bounded(tiny_run: Path) -> Iterator[Served]:
    served = Served(tiny_run, "--request-timeout", "1", "--max-connections", "3")
    yield served
    assert served.stop()[0] == 0
    assert served.err == ""  # a request cut off mid-body is no traceback


def test_a_request_that_stops_halfway_is_answered_408_and_closed(bounded):
    """Half a head, half a body, and the second request of a kept-alive connection: each is
    answered 408 in OpenAI's error body and closed once --request-timeout (1 s) has passed;
    a connection that sends nothing is closed without an answer."""
    addr = address(bounded)
    assert ask(addr, HALF_HEAD) == (b"HTTP/1.1 408 Request Timeout", TIMEOUT_BODY)
    assert ask(addr, HALF_BODY) == (b"HTTP/1.1 408 Request Timeout", TIMEOUT_BODY)
    assert ask(addr, b"") == (b"", None)
    kept = socket.create_connection(addr, timeout=30)
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    first = kept.makefile("rb")
    assert first.readline() == b"HTTP/1.1 200 OK\r\n"
    length = next(int(line.split(b":")[1]) for line in iter(first.readline, b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    first.read(length)  # the rest of the first answer, the connection kept alive
    kept.sendall(b"GET /hea")
    assert answer(kept) == (b"HTTP/1.1 408 Request Timeout", TIMEOUT_BODY)


def test_past_max_connections_a_request_is_answered_503(bounded):
    addr = address(bounded)
    idle = [socket.create_connection(addr) for _ in range(3)]  # --max-connections 3
    try:
        time.sleep(0.2)  # let the server accept them
        status, body = ask(addr, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    finally:
        for sock in idle:
            sock.close()
    assert status == b"HTTP/1.1 503 Service Unavailable"
    assert body["error"] == {"message": "the server has 3 connections open, its "
                             "--max-connections; retry in a second", "type": "server_error",
                             "param": None, "code": "too_many_connections"}
    deadline = time.monotonic() + 30  # the idle ones are closed: the server answers again
    while (status := ask(addr, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                         )[0]) != b"HTTP/1.1 200 OK" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == b"HTTP/1.1 200 OK"


def test_sockets_past_the_open_files_limit_cost_one_warning_and_the_server_still_answers(
        tiny_run):
    """150 sockets that send half a head, under a limit of 128 open files and a --request-
    timeout of 30 s: the default --max-connections is lowered to fit (one warning); accept()
    fails while they come (one warning, no traceback per try); those past the cap are answered
    408 within a second, so /health is answered (503, the cap is full) while the rest are held,
    and 200 with a completion once they go."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))

    served = Served(tiny_run, "--request-timeout", "30", preexec_fn=limit)
    addr = address(served)
    health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    try:
        held = []
        for _ in range(150):
            sock = socket.create_connection(addr)
            sock.sendall(HALF_HEAD)
            held.append(sock)
        cap = 128 - 32
        for sock in held[cap:]:  # past the cap: a second to send the rest, then 408
            assert answer(sock, timeout=20)[0] == b"HTTP/1.1 408 Request Timeout"
        sock = socket.create_connection(addr, timeout=20)  # the first 96 are still held
        sock.sendall(health)
        assert answer(sock, timeout=20)[0] == b"HTTP/1.1 503 Service Unavailable"
        for sock in held[:cap]:
            sock.close()
        deadline = time.monotonic() + 30
        while (status := ask(addr, health)[0]) != b"HTTP/1.1 200 OK" and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert status == b"HTTP/1.1 200 OK"
        completion = b'{"prompt": "A", "max_tokens": 3}'
        status, body = ask(addr, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: "
                           b"close\r\nContent-Type: application/json\r\nContent-Length: "
                           + str(len(completion)).encode() + b"\r\n\r\n" + completion)
        assert (status, len(body["choices"][0]["text"])) == (b"HTTP/1.1 200 OK", 3)
    finally:
        code = served.stop()[0]
    assert code == 0
    assert served.err.splitlines() == [
        "warning: --max-connections 512 lowered to 96: this process may open 128 files "
        "(ulimit -n); raise that limit to hold more",
        "warning: cannot accept connections: Too many open files; they wait until open ones "
        "close (see --max-connections, --request-timeout and ulimit -n)"]
