"""The operator's view of the outbox's activity (``sql/activity.sql``), which
only the dashboard shows and no tenant reads: attempts per minute and per
hour, each endpoint's last hour, the dispatchers seen, a destination's breaker.
Each statement reads a bounded window or a bounded number of rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from dispatchers.store.web import Conn, rows
from outbox.internal import DestinationHealth


class Minute(NamedTuple):
    """A row of ``web_minutes`` and ``web_hours``: attempts that started in one
    minute (or hour)."""

    minute: datetime
    delivered: int
    failed: int


class Owner(NamedTuple):
    """A row of ``web_dispatchers``: one dispatcher (lease owner) seen lately."""

    owner: str
    in_flight: int
    lease_until: datetime | None
    last_attempt_at: datetime | None
    last_seen: datetime | None
    """When its latest attempt of the last hour ended."""
    status: str
    """``alive`` (a lease not run out, or an attempt in the last minute),
    ``lease expired`` (it holds only leases that ran out: it stopped without
    handing them back) or ``stopped`` (stopped, or idle: nothing tells them apart)."""


class EndpointHour(NamedTuple):
    """The row of ``web_endpoint_hour``: one endpoint's last hour, and now."""

    attempts: int
    delivered: int
    p50_ms: int | None
    p99_ms: int | None
    statuses: dict[str, int]
    """Attempts by response status (``none``: no response)."""
    in_flight: int

    @property
    def success_rate(self) -> float | None:
        return self.delivered / self.attempts if self.attempts else None


class EndpointsHour(NamedTuple):
    """A row of ``web_endpoints_hour``: one endpoint's last hour, for the list."""

    endpoint_id: int
    attempts: int
    delivered: int
    p50_ms: int | None
    p99_ms: int | None
    in_flight: int

    @property
    def success_rate(self) -> float | None:
        return self.delivered / self.attempts if self.attempts else None


def minutes(conn: Conn, schema: str) -> list[Minute]:
    """Attempts per minute over the last hour."""
    return rows(conn, schema, "web_minutes", {}, Minute)


def hours(conn: Conn, schema: str, *, since: datetime, until: datetime) -> list[Minute]:
    """Attempts per (UTC) hour in the whole hours from ``since`` to ``until``."""
    return rows(conn, schema, "web_hours", {"since": since, "until": until}, Minute)


def endpoint_hour(conn: Conn, schema: str, endpoint_id: int) -> EndpointHour:
    """One endpoint's last hour, and its deliveries in flight now."""
    return rows(conn, schema, "web_endpoint_hour", {"endpoint_id": endpoint_id}, EndpointHour)[0]


def endpoints_hour(conn: Conn, schema: str) -> dict[int, EndpointsHour]:
    """Every endpoint's last hour (those with attempts or deliveries in flight)."""
    return {r.endpoint_id: r for r in rows(conn, schema, "web_endpoints_hour", {}, EndpointsHour)}


def owners(conn: Conn, schema: str) -> list[Owner]:
    """The dispatchers seen lately (at most a hundred), the live ones first."""
    return rows(conn, schema, "web_dispatchers", {}, Owner)


def destination_health(conn: Conn, schema: str, destination: str) -> DestinationHealth | None:
    """Why ``destination`` is blocked, or None if it is not."""
    found = rows(
        conn, schema, "web_destination_health", {"destination": destination}, DestinationHealth
    )
    return found[0] if found else None
