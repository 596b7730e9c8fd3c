"""`GET /metrics` of `charlm serve`, in Prometheus' text format. Each app has its own registry,
so two apps in one process (the tests) count apart."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from charlm.serve.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FIRST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
PER_CHARACTER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class Metrics:
    """The app's counters and histograms, and a collector of `Engine.stats()`, read per scrape."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.registry = CollectorRegistry()
        self.requests = Counter("charlm_requests", "HTTP requests answered.",
                                ["endpoint", "status"], registry=self.registry)
        self.first_character = Histogram(
            "charlm_time_to_first_character_seconds",
            "From a completion's admission to its first generated character.",
            buckets=FIRST_BUCKETS, registry=self.registry)
        self.per_character = Histogram(
            "charlm_character_latency_seconds",
            "Between a completion's later characters (an event's time over its characters).",
            buckets=PER_CHARACTER_BUCKETS, registry=self.registry)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        s = self.engine.stats()
        yield CounterMetricFamily("charlm_characters_generated", "Characters generated in all.",
                                  value=s.characters)
        for name, value, help in [
            ("charlm_queue_depth", s.queued, "Requests waiting for a free slot."),
            ("charlm_batch_size", s.batch_size, "Rows in the latest decode step."),
            ("charlm_slots", s.slots, "Rows the engine decodes at most at once."),
            ("charlm_slots_busy", s.busy, "Slots held by a request."),
        ]:
            yield GaugeMetricFamily(name, help, value=value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountResponses:
    """ASGI middleware: counts every response by endpoint ("other" outside `endpoints`, so
    scanners cannot grow the label set) and status (500 when none was sent)."""

    def __init__(self, app: Any, metrics: Metrics, endpoints: Iterable[str]):
        self.app, self.metrics, self.endpoints = app, metrics, frozenset(endpoints)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        endpoint = scope["path"] if scope["path"] in self.endpoints else "other"
        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(endpoint, str(status)).inc()
