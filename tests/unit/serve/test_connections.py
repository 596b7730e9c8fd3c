"""The bounds on connections (charlm.serve.connections): the cap fits the open-files limit, and
an accept() out of descriptors is one warning line a minute, not a traceback per try."""

import asyncio
import errno
import os

import pytest

pytest.importorskip("uvicorn")  # the serve extra

from charlm.serve import connections  # noqa: E402

resource = pytest.importorskip("resource")  # POSIX


def test_accept_out_of_descriptors_is_one_warning_line_a_minute(capsys, monkeypatch):
    """asyncio calls the handler once per pending connection per pass (122,705 tracebacks in
    15 s); the rest of the loop's errors still reach its default handler."""
    loop = asyncio.new_event_loop()
    others = []
    monkeypatch.setattr(loop, "default_exception_handler", others.append)
    try:
        connections.quiet_accept_errors(loop)
        failed = {"message": connections.ACCEPT_FAILED,
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
    assert connections.connection_cap(512) == 512
    assert capsys.readouterr().err == ""
    assert connections.connection_cap(2000) == 1024 - connections.RESERVED_FILES
    assert capsys.readouterr().err == (
        "warning: --max-connections 2000 lowered to 992: this process may open 1024 files "
        "(ulimit -n); raise that limit to hold more\n")
