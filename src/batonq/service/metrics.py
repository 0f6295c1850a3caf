"""Prometheus metrics at /metrics, on a registry of the app's own."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from batonq.client import AsyncClient
from batonq.errors import LeaseLost
from batonq.models import QueueStats

__all__ = ["Metrics"]

SCRAPE_EVERY_S = 5.0
"""/metrics is rendered at most this often: one count of every queue in that
time, however many scrape it."""
_STATES = ("waiting", "held", "pending", "scheduled", "leased", "done", "dead", "cancelled")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tasks = Gauge(
            "batonq_tasks", "Tasks by queue and state", ["queue", "state"], registry=self.registry
        )
        self.oldest = Gauge(
            "batonq_oldest_pending_age_seconds", "Age of the oldest claimable task", ["queue"],
            registry=self.registry,
        )  # fmt: skip
        self.claims = Counter(
            "batonq_claims", "Tasks claimed through this service", ["queue"], registry=self.registry
        )
        self.completions = Counter(
            "batonq_completions", "Submits accepted or replayed", ["queue", "outcome"], registry=self.registry
        )
        self.refused = Counter(
            "batonq_refused_submits", "Writes refused because the lease was lost", ["queue"],
            registry=self.registry,
        )  # fmt: skip
        self.expiries = Counter(
            "batonq_lease_expiries", "Leases expired by this process's sweeper", registry=self.registry
        )
        # The sweeper counts its expiries itself; the counter catches up with it at each scrape.
        self._swept_seen = 0
        self._scraped: tuple[float, bytes] | None = None  # (time.monotonic(), the exposition)
        self._scraping = asyncio.Lock()
        self.latency = Histogram(
            "batonq_http_request_duration_seconds", "HTTP request latency", ["method", "route", "status"],
            registry=self.registry,
        )  # fmt: skip

    @contextlib.contextmanager
    def refusals(self, queue: str) -> Iterator[None]:
        """Count a LeaseLost raised inside, and let it go on."""
        try:
            yield
        except LeaseLost:
            self.refused.labels(queue).inc()
            raise

    async def scrape(self, reader: AsyncClient, swept: int) -> bytes:
        """The exposition, rendered anew only when the last is
        ``SCRAPE_EVERY_S`` old: scrapers at the same time share one render.
        The counts come from ``reader``; ``swept`` is this process's sweeper's."""
        async with self._scraping:
            if self._scraped is None or time.monotonic() - self._scraped[0] >= SCRAPE_EVERY_S:
                self._scraped = (time.monotonic(), self.render(await reader.queues(), swept))
            return self._scraped[1]

    def render(self, stats: list[QueueStats], swept: int) -> bytes:
        for q in stats:
            for state in _STATES:
                self.tasks.labels(q.queue, state).set(getattr(q, state))
            self.oldest.labels(q.queue).set(q.oldest_pending_age_s or 0)
        self.expiries.inc(max(0, swept - self._swept_seen))
        self._swept_seen = max(self._swept_seen, swept)
        return generate_latest(self.registry)
