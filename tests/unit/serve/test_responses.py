"""charlm.serve.responses: the engine's events handed to the event loop (`Mailbox`)."""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("fastapi")  # the serve extra

from charlm.serve.responses import Mailbox  # noqa: E402


def test_the_mailbox_wakes_the_loop_once_for_what_is_posted_before_it_runs():
    """Events posted from another thread while the loop is busy arrive with one wake-up, each in
    its own queue in the order posted; the next post after the delivery wakes it again."""
    async def main() -> None:
        loop = asyncio.get_running_loop()
        wakes = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda f, *args: wakes.append(f) or real(f, *args)
        mailbox = Mailbox(loop)
        odd, even = asyncio.Queue(), asyncio.Queue()
        poster = threading.Thread(target=lambda: [mailbox.post(odd if k % 2 else even, k)
                                                  for k in range(100)])
        poster.start()
        poster.join()  # the loop has not run meanwhile: nothing is delivered yet
        assert len(wakes) == 1 and odd.empty() and even.empty()
        await asyncio.sleep(0)
        assert [odd.get_nowait() for _ in range(50)] == list(range(1, 100, 2))
        assert [even.get_nowait() for _ in range(50)] == list(range(0, 100, 2))
        mailbox.post(odd, "next")
        assert len(wakes) == 2
        await asyncio.sleep(0)
        assert odd.get_nowait() == "next"

    asyncio.run(main())


def test_the_mailbox_of_a_closed_loop_drops_what_is_posted():
    """A stream whose loop has closed (the server stopping) takes no more events: posting to
    it neither raises on the engine's thread nor keeps the events."""
    loop = asyncio.new_event_loop()
    loop.close()
    mailbox = Mailbox(loop)
    for k in range(3):
        mailbox.post(asyncio.Queue(), k)
    assert mailbox.items == [] and not mailbox.pending
