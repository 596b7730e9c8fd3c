"""Running the app (charlm.serve.server): the listening socket, and the bounds on connections:
the cap fits the open-files limit, and an accept() out of descriptors is one warning line a
minute, not a traceback per try."""

import asyncio
import errno
import os

import pytest

pytest.importorskip("uvicorn")  # the serve extra

from charlm.core.errors import CharlmError  # noqa: E402
from charlm.serve import server  # noqa: E402
from charlm.serve.server import listen  # noqa: E402

resource = pytest.importorskip("resource")  # POSIX


def test_a_port_in_use_is_one_error_line_and_port_0_takes_a_free_one():
    with listen("127.0.0.1", 0) as sock:
        port = sock.getsockname()[1]
        assert port > 0
        with pytest.raises(CharlmError) as e:
            listen("127.0.0.1", port)
    assert str(e.value) == (f"cannot listen on 127.0.0.1:{port}: Address already in use; give "
                            "another --port, or a --host of this machine")
    listen("127.0.0.1", port).close()  # free again once the first socket closed


def test_its_connections_send_without_nagles_delay():
    """/health took 44 ms: the answer's second small write waited for the client's delayed
    ACK (Nagle's algorithm), which uvicorn leaves on for a socket it is given."""
    import socket

    with listen("127.0.0.1", 0) as sock, socket.create_connection(sock.getsockname()):
        accepted, _ = sock.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.parametrize("host", ["999.1.1.1"])
def test_a_host_that_is_no_address_is_named_so(host):
    """`--host 999.1.1.1` was "cannot listen on 999.1.1.1:0: Unknown error -2"."""
    with pytest.raises(CharlmError) as e:
        listen(host, 0)
    assert str(e.value) == (f"cannot listen on {host}:0: {host} is neither an IP address nor a "
                            "host name that resolves; give a --host of this machine (127.0.0.1, "
                            "0.0.0.0, ::1)")


def test_accept_out_of_descriptors_is_one_warning_line_a_minute(capsys, monkeypatch):
    """asyncio calls the handler once per pending connection per pass (122,705 tracebacks in
    15 s); the rest of the loop's errors still reach its default handler."""
    loop = asyncio.new_event_loop()
    others = []
    monkeypatch.setattr(loop, "default_exception_handler", others.append)
    try:
        server.quiet_accept_errors(loop)
        failed = {"message": server.ACCEPT_FAILED,
                  "exception": OSError(errno.EMFILE, os.strerror(errno.EMFILE))}
        for _ in range(1000):
            loop.call_exception_handler(failed)
        loop.call_exception_handler({"message": "something else"})
    finally:
        loop.close()
    assert capsys.readouterr().err == (
        "warning: cannot accept connections: Too many open files; they wait until open ones "
        "close (see --max-connections, --request-timeout and ulimit -n)\n")
    assert others == [{"message": "something else"}]


def test_the_connection_cap_fits_the_open_files_limit(capsys, monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 4096))
    assert server.connection_cap(512) == 512
    assert capsys.readouterr().err == ""
    assert server.connection_cap(2000) == 1024 - server.RESERVED_FILES
    assert capsys.readouterr().err == (
        "warning: --max-connections 2000 lowered to 992: this process may open 1024 files "
        "(ulimit -n); raise that limit to hold more\n")
