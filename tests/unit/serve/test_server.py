"""Running the app (charlm.serve.server): the listening socket."""

import pytest

pytest.importorskip("uvicorn")  # the serve extra

from charlm.core.errors import CharlmError  # noqa: E402
from charlm.serve.server import listen  # noqa: E402


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
