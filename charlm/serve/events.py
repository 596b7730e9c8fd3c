"""The engine's events on the event loop: `Mailbox` hands them over from the engine's thread,
`Completions` merges those of one HTTP request into one queue."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from charlm.serve.engine import Engine
from charlm.serve.metrics import Metrics
from charlm.serve.request import Event, Params, Request


class Mailbox:
    """`post` queues an item for an asyncio.Queue from any thread and wakes the loop only if no
    wake-up is pending, so one wake-up delivers a whole decode step's events."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list[tuple[asyncio.Queue, Any]] = []
        self.pending = False  # a wake-up is on its way

    def post(self, queue: asyncio.Queue, item: Any) -> None:  # on any thread
        with self.lock:
            self.items.append((queue, item))
            if self.pending:
                return
            self.pending = True
        try:
            self.loop.call_soon_threadsafe(self.deliver)
        except RuntimeError:  # the loop has closed: nobody waits any more
            with self.lock:
                self.items.clear()
                self.pending = False

    def deliver(self) -> None:  # on the loop
        with self.lock:
            items, self.items, self.pending = self.items, [], False
        for queue, item in items:
            queue.put_nowait(item)


class Completions:
    """The engine requests behind one HTTP request, their events in one queue, timed."""

    def __init__(self, engine: Engine, jobs: list[tuple[str, Params]], metrics: Metrics,
                 mailbox: Mailbox):
        self.metrics = metrics
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.requests: list[Request] = []
        self.open: set[int] = set()
        self.start = time.monotonic()

        def on_event(i: int, event: Event) -> None:  # on the engine's thread
            mailbox.post(self.queue, (i, event))

        try:
            for i, (prompt, params) in enumerate(jobs):
                self.requests.append(engine.submit(prompt, params, functools.partial(on_event, i)))
                self.open.add(i)
        except BaseException:
            self.cancel()
            raise

    async def events(self) -> AsyncIterator[list[tuple[int, Event]]]:
        """Every (choice index, event) that has arrived, until every choice has ended."""
        last: dict[int, float] = {}
        while self.open:
            ready = [await self.queue.get()]
            while not self.queue.empty():
                ready.append(self.queue.get_nowait())
            now = time.monotonic()
            for i, event in ready:
                if event.text:
                    if i in last:
                        self.metrics.per_character.observe((now - last[i]) / len(event.text))
                    else:
                        self.metrics.first_character.observe(now - self.start)
                    last[i] = now
                if event.finish_reason is not None:
                    self.open.discard(i)
            yield ready

    def cancel(self) -> None:
        """Free the slots of the choices still going."""
        for i in self.open:
            self.requests[i].cancel()
