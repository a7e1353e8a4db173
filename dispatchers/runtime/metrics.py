"""Prometheus metrics and a health endpoint for one dispatcher process.

``outbox dispatch --metrics-port N`` serves ``/metrics``, ``/healthz`` (a readiness
probe: 503 while the database does not answer) and ``/livez`` (a liveness probe:
200 while the event loop runs), on 127.0.0.1 unless told otherwise. A process
serving several databases serves one port (:class:`Labelled`), every sample
labelled with its ``database``.

Design: docs/explanation/design/metrics.md
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from dispatchers.errors import DispatcherFailed

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
OTHER_DESTINATIONS = "(other)"
"""The ``destination`` label of the backlog summed past the top destinations."""


class Metrics:
    """The dispatcher's instruments, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.deliveries = Counter(
            "outbox_deliveries", "Delivery attempts by outcome", ["outcome"], registry=r
        )
        self.attempt_seconds = Histogram(
            "outbox_attempt_duration_seconds",
            "Duration of one HTTP attempt",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.commit_to_delivery_seconds = Histogram(
            "outbox_commit_to_delivery_seconds",
            "From the message's insert to its successful delivery being recorded",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("outbox_in_flight", "Claimed messages not yet recorded", registry=r)
        self.claims = Counter("outbox_claims", "Claim statements run", registry=r)
        self.claim_batch = Histogram(
            "outbox_claim_batch_size", "Messages per claim", buckets=BATCH_BUCKETS, registry=r
        )
        self.flush_batch = Histogram(
            "outbox_outcome_batch_size",
            "Outcomes per completion statement",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.lease_lost = Counter(
            "outbox_lease_lost", "Deliveries abandoned because their lease was lost", registry=r
        )
        self.db_errors = Counter(
            "outbox_db_errors", "Database errors by operation", ["operation"], registry=r
        )
        self.health_transitions = Counter(
            "outbox_destination_health_transitions",
            "Circuit breakers opened, probing, closed, reopened; destinations held by Retry-After",
            ["transition"],
            registry=r,
        )
        self.messages_ready = Gauge(
            "outbox_messages_ready",
            "Ready messages due now, per destination: the destinations with the most, "
            'the rest summed under destination="(other)"; read every backlog interval',
            ["destination"],
            registry=r,
        )
        self.oldest_ready_seconds = Gauge(
            "outbox_oldest_ready_seconds",
            "How long the oldest ready message of the destination has been due",
            ["destination"],
            registry=r,
        )
        self.last_db_success = time.monotonic()
        self.db_unreachable_since: float | None = None
        """When the database last stopped answering (None: it answers)."""

    def database_answered(self) -> None:
        self.last_db_success = time.monotonic()
        self.db_unreachable_since = None

    def database_unreachable(self) -> None:
        """An operation found no database to answer it (a lost connection, none
        to be had, no answer in time), and none answered since."""
        if self.db_unreachable_since is None:
            self.db_unreachable_since = time.monotonic()

    def backlog(self, rows: Sequence[tuple[str | None, int, float]]) -> None:
        """Replace the backlog gauges with ``rows`` (destination, ready, oldest
        seconds; None for the rest summed): a destination that has none due
        any more leaves the gauges rather than stay at its last value."""
        self.messages_ready.clear()
        self.oldest_ready_seconds.clear()
        for destination, ready, oldest_s in rows:
            label = OTHER_DESTINATIONS if destination is None else destination
            self.messages_ready.labels(label).set(ready)
            self.oldest_ready_seconds.labels(label).set(max(0.0, oldest_s))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class Exposition(Protocol):
    """What :func:`serve` answers ``/metrics`` with."""

    def render(self) -> bytes: ...


class Labelled(Collector):
    """The samples of several registries as one, each with a label naming its
    registry: ``sources`` gives (label value, registry) pairs, read at every
    scrape, so a registry replaced meanwhile (a database's dispatcher started
    again) is the one collected."""

    def __init__(
        self, label: str, sources: Callable[[], Iterable[tuple[str, CollectorRegistry]]]
    ) -> None:
        self._label = label
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        # One family per name, whatever the number of registries: the text format
        # allows each name once.
        families: dict[str, Metric] = {}
        for value, registry in self._sources():
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                merged.samples.extend(
                    sample._replace(labels={self._label: value, **sample.labels})
                    for sample in family.samples
                )
        yield from families.values()


PATHS = ("/metrics", "/healthz", "/livez")
"""What :func:`serve` answers: Prometheus metrics, database health, liveness."""

MAX_CONNECTIONS = 64
"""Connections :func:`serve` holds at once; one past it is closed on arrival. A
scrape or probe takes one for a moment, so the bound is reached only by clients
that hold theirs open (headers sent a byte at a time): they cannot take the
descriptors the dispatcher needs for its database and its deliveries."""

HEADER_SECONDS = 5.0
"""How long a connection may take to send its request's headers."""


async def serve(
    metrics: Exposition,
    *,
    host: str,
    port: int,
    healthy: Callable[[], bool],
    health_text: Callable[[], bytes] | None = None,
) -> asyncio.Server:
    """Start the /metrics, /healthz and /livez server on the running loop: at most
    :data:`MAX_CONNECTIONS` at once, each closed unless its headers arrive within
    :data:`HEADER_SECONDS`. ``health_text``, if given, is the body of /healthz.

    Called first thing at start, before anything needs undoing: an address that
    cannot be bound (a port taken) is :class:`~dispatchers.errors.DispatcherFailed`,
    which fails the start in one line."""
    open_connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_connections
        if open_connections >= MAX_CONNECTIONS:
            writer.close()
            return
        open_connections += 1
        try:
            async with asyncio.timeout(HEADER_SECONDS):
                request = await reader.readuntil(b"\r\n\r\n")
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            if path == b"/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, metrics.render()
            elif path == b"/livez":
                status, ctype, body = "200 OK", "text/plain", b"alive\n"
            elif path == b"/healthz":
                ok = healthy()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype = "text/plain"
                if health_text is not None:
                    body = health_text()
                else:
                    body = b"ok\n" if ok else b"database unreachable\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode("ascii") + body)
            async with asyncio.timeout(HEADER_SECONDS):  # nor hold it by not reading
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            open_connections -= 1
            writer.close()

    try:
        return await asyncio.start_server(handle, host, port, limit=16 * 1024)
    except OSError as exc:
        raise DispatcherFailed(
            f"cannot serve metrics on {host} port {port}:"
            f" {os.strerror(exc.errno) if exc.errno else exc}"
        ) from None


def urls(server: asyncio.Server) -> dict[str, str]:
    """The URL of each of :data:`PATHS` on ``server``, at the address and port
    it actually listens on (a port of 0 asked the system for one)."""
    host, port = server.sockets[0].getsockname()[:2]
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {path.lstrip("/"): f"http://{authority}{path}" for path in PATHS}
