"""The dashboard's database access: a small pool, read-only pages, written actions.

Pages and actions call the library's operator functions (:mod:`outbox.admin`),
which are synchronous and run in the caller's transaction; here each runs in a
worker thread on a pooled connection, so a slow query never blocks the event
loop that serves the other requests. A connection is checked before each use
and waited for at most :data:`~dispatchers.ui.limits.CONNECTION_WAIT` seconds:
while the database is unreachable, a request fails within that bound (a
``psycopg_pool.PoolTimeout``, answered 503 by the surfaces), and the pool
connects again, on demand, as soon as the database is back. Every page runs in
a ``READ ONLY`` transaction: a page cannot write, whatever its code does. Only
:meth:`DashboardStore.write` opens a transaction that can, and the dashboard
never calls it in read-only mode.

The dashboard's statements are those of ``dispatchers/ui/queries.sql``
(:func:`ui_queries`), bound to the schema by the library's loader.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from dispatchers.ui.limits import CONNECTION_WAIT
from outbox.admin import NO_TENANT
from outbox.internal import DestinationHealth, Queries, catalog, rows_plan, run_sync, scalar
from outbox.tenants import Tenant, Tenants

T = TypeVar("T")

QUERIES = Path(__file__).with_name("queries.sql")
"""The dashboard's own statements (shipped in the wheel with the package)."""

SEARCH_LIMIT = 100
"""The most messages one search shows."""

BODY_SCAN = 5000
"""The most messages of the queue, and of the history, whose bodies one search
for a text in bodies reads: the newest that match the other filters, before
the page's cursor."""

LISTED_TYPES = 10
"""The most event types the endpoints list shows of one endpoint (its page
shows them all)."""

RECENT_ATTEMPTS = 20
"""The most attempts an endpoint's page lists."""

SETTLED = timedelta(minutes=5)
"""How long after an hour ends its attempts are taken as all recorded: an attempt
is written when it ends, and none runs this long."""

_DAY = timedelta(hours=23)
"""The day chart's whole hours (the hour in progress comes from the minutes)."""

BOUNDED = "SET LOCAL statement_timeout = 5000; SET LOCAL jit = off"
"""Each statement of a page or an action runs at most 5 s: a page that cannot
answer in time fails instead of holding a connection of the small pool. Without
JIT: every page reads bounded windows through indexes, and on a JIT-enabled server
(as distributions and managed services ship PostgreSQL) a statement whose estimate
passes jit_above_cost is compiled at each execution, for longer than it runs. Set
per transaction, not per connection, so that it works behind a pooler."""

READ_ONLY = "SET TRANSACTION READ ONLY; " + BOUNDED


def ui_queries(schema: str) -> Queries:
    """The dashboard's statements bound to ``schema`` (cached by the loader)."""
    return catalog(schema, (QUERIES,))


class Minute(NamedTuple):
    """A row of ``ui_minutes``: attempts that started in one minute."""

    minute: datetime
    delivered: int
    failed: int


class Owner(NamedTuple):
    """A row of ``ui_dispatchers``: one dispatcher (lease owner) seen lately."""

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
    """The row of ``ui_endpoint_hour``: one endpoint's last hour, and now."""

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
    """A row of ``ui_endpoints_hour``: one endpoint's last hour, for the list."""

    endpoint_id: int
    attempts: int
    delivered: int
    p50_ms: int | None
    p99_ms: int | None
    in_flight: int

    @property
    def success_rate(self) -> float | None:
        return self.delivered / self.attempts if self.attempts else None


class RecentAttempt(NamedTuple):
    """A row of ``ui_endpoint_attempts``."""

    message_id: int
    attempt: int
    owner: str
    started_at: datetime
    duration_ms: int | None
    status: int | None
    outcome: str
    error_class: str | None


class ListedEndpoint(NamedTuple):
    """A row of ``ui_endpoint_page``: one endpoint of the list."""

    id: int
    url: str
    description: str
    tenant: str | None
    """The external id of its tenant; None: the operator's own."""
    event_types: list[str]
    """The first :data:`LISTED_TYPES`."""
    event_type_count: int
    enabled: bool
    disabled_reason: str | None
    failure_streak: int
    failing_since: datetime | None
    last_success_at: datetime | None
    max_concurrency: int | None
    secrets: Any
    """jsonb: ``[{"secret", "key_id", "expires_at"}]``, as stored, newest first."""
    pending: int
    dead: int


class Found(NamedTuple):
    """A row of ``ui_messages``: one message matching a search."""

    id: int
    idempotency_key: str
    url: str | None
    endpoint_id: int | None
    tenant: str | None
    """The external id of its endpoint's tenant; None: no tenant's."""
    event_type: str | None
    state: str
    attempts: int
    last_status: int | None
    created_at: datetime
    held: bool
    """Ready, but its destination's breaker is open or a Retry-After holds it."""


class EndpointTenant(NamedTuple):
    """A row of ``ui_endpoint_tenants``."""

    id: int
    tenant: str


class DashboardStore:
    """The dashboard's connections to one database, for one schema."""

    def __init__(self, url: str, *, schema: str, max_size: int = 4) -> None:
        self.schema = schema
        self._kept: dict[datetime, Minute] = {}  # settled hours of the day chart
        self._read_until: datetime | None = None  # every hour before it is kept
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            open=False,
            kwargs={"connect_timeout": math.ceil(CONNECTION_WAIT)},
            timeout=CONNECTION_WAIT,
            # a connection the server closed (stopped, restarted) is replaced,
            # not handed to a page; an attempt to connect that keeps failing is
            # given up soon, so that the next request tries again at once
            # instead of after the pool's growing backoff
            check=ConnectionPool.check_connection,
            reconnect_timeout=CONNECTION_WAIT,
        )

    def open(self) -> None:
        self._pool.open(wait=True, timeout=15)

    def close(self) -> None:
        self._pool.close()

    async def read(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``work`` in a read-only transaction, in a worker thread."""
        return await asyncio.to_thread(self._run, work, read_only=True)

    async def write(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run ``work`` in a transaction that commits when it returns."""
        return await asyncio.to_thread(self._run, work, read_only=False)

    def _run(self, work: Callable[[psycopg.Connection[Any]], T], *, read_only: bool) -> T:
        with self._pool.connection() as conn:
            conn.execute(READ_ONLY if read_only else BOUNDED)
            return work(conn)

    # -- the dashboard's own statements (queries.sql) --------------------------------

    def minutes(self, conn: psycopg.Connection[Any]) -> list[Minute]:
        return run_sync(conn, rows_plan(ui_queries(self.schema)["ui_minutes"], {}, Minute))

    def hours(self, conn: psycopg.Connection[Any], *, until: datetime) -> list[Minute]:
        """Attempts per hour in the 23 whole hours before ``until`` (an hour's
        start). A day of attempts is the overview's heaviest read and the page
        refreshes every few seconds, but an hour no longer changes once the
        attempts running when it ended are recorded (:data:`SETTLED`): each
        settled hour is read once and kept while it is in the window, so a
        refresh reads only the hours after the last settled one (one or two,
        never the day)."""
        start = until - _DAY
        kept, read_until = self._kept, self._read_until
        since = max(start, read_until) if read_until is not None else start
        rows: list[Minute] = []
        if since < until:
            params = {"since": since, "until": until}
            rows = run_sync(conn, rows_plan(ui_queries(self.schema)["ui_hours"], params, Minute))
        row = conn.execute("SELECT now()").fetchone()
        now: datetime = row[0] if row else datetime.now(UTC)
        settled = min(
            until, (now - SETTLED).astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        )
        kept = {hour: m for hour, m in kept.items() if hour >= start}
        kept.update((m.minute, m) for m in rows if m.minute < settled)
        self._kept = kept
        self._read_until = max(settled, since) if read_until is None else max(settled, read_until)
        fresh = [m for m in rows if m.minute >= settled]
        return sorted([*kept.values(), *fresh], key=lambda m: m.minute)

    def warm(self, conn: psycopg.Connection[Any]) -> None:
        """Read the day chart's hours before the first overview asks for them
        (the day's first read is the dashboard's heaviest)."""
        row = conn.execute("SELECT now()").fetchone()
        now: datetime = row[0] if row else datetime.now(UTC)
        self.hours(conn, until=now.astimezone(UTC).replace(minute=0, second=0, microsecond=0))

    def endpoint_hour(self, conn: psycopg.Connection[Any], endpoint_id: int) -> EndpointHour:
        plan = rows_plan(
            ui_queries(self.schema)["ui_endpoint_hour"], {"endpoint_id": endpoint_id}, EndpointHour
        )
        return run_sync(conn, plan)[0]

    def endpoints_hour(self, conn: psycopg.Connection[Any]) -> dict[int, EndpointsHour]:
        plan = rows_plan(ui_queries(self.schema)["ui_endpoints_hour"], {}, EndpointsHour)
        return {row.endpoint_id: row for row in run_sync(conn, plan)}

    def endpoint_attempts(
        self, conn: psycopg.Connection[Any], endpoint_id: int
    ) -> list[RecentAttempt]:
        params = {"endpoint_id": endpoint_id, "limit": RECENT_ATTEMPTS}
        plan = rows_plan(ui_queries(self.schema)["ui_endpoint_attempts"], params, RecentAttempt)
        return run_sync(conn, plan)

    def destination_health(
        self, conn: psycopg.Connection[Any], destination: str
    ) -> DestinationHealth | None:
        """Why ``destination`` is blocked, or None if it is not."""
        query = ui_queries(self.schema)["ui_destination_health"]
        rows = run_sync(conn, rows_plan(query, {"destination": destination}, DestinationHealth))
        return rows[0] if rows else None

    def owners(self, conn: psycopg.Connection[Any]) -> list[Owner]:
        return run_sync(conn, rows_plan(ui_queries(self.schema)["ui_dispatchers"], {}, Owner))

    def endpoint_page(
        self,
        conn: psycopg.Connection[Any],
        *,
        after: int,
        attention: bool,
        limit: int,
        tenant: str | None = None,
    ) -> list[ListedEndpoint]:
        """Up to ``limit`` endpoints after id ``after``, by id (those that need
        attention only, if asked; those of ``tenant`` only, an external id or
        :data:`~outbox.admin.NO_TENANT`, if given)."""
        params = {
            "after": after,
            "attention": attention,
            "limit": limit,
            "types": LISTED_TYPES,
            "tenant": tenant,
        }
        plan = rows_plan(ui_queries(self.schema)["ui_endpoint_page"], params, ListedEndpoint)
        return run_sync(conn, plan)

    def endpoint_tenants(self, conn: psycopg.Connection[Any], ids: list[int]) -> dict[int, str]:
        """The tenant of each endpoint of ``ids`` that has one (by external id)."""
        if not ids:
            return {}
        query = ui_queries(self.schema)["ui_endpoint_tenants"]
        rows = run_sync(conn, rows_plan(query, {"ids": sorted(set(ids))}, EndpointTenant))
        return {row.id: row.tenant for row in rows}

    def tenant(self, conn: psycopg.Connection[Any], external_id: str) -> Tenant | None:
        """The tenant of ``external_id`` (checked already), or None if there is none."""
        return Tenants(schema=self.schema).get(conn, external_id)

    def unknown_tenant(self, conn: psycopg.Connection[Any], tenant: str | None) -> str | None:
        """``tenant``, a filter's, if it names no tenant (a page then says so
        rather than only that nothing matches); else None."""
        if tenant is None or tenant == NO_TENANT:
            return None
        return tenant if self.tenant(conn, tenant) is None else None

    def sealed_secrets(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether any signing secret is sealed."""
        rows = run_sync(conn, rows_plan(ui_queries(self.schema)["ui_sealed_secrets"], {}, scalar))
        return bool(rows[0])

    def search(
        self,
        conn: psycopg.Connection[Any],
        *,
        key: str | None,
        event_type: str | None,
        endpoint_id: int | None,
        state: str | None,
        created_from: datetime | None,
        created_until: datetime | None,
        body: str | None = None,
        tenant: str | None = None,
        before: int | None = None,
        after: int | None = None,
        limit: int = SEARCH_LIMIT,
    ) -> list[Found]:
        """Up to ``limit`` messages matching every filter given, newest first:
        older than id ``before``, or the newest just newer than id ``after``.
        ``body``: text to find in bodies, looked for in the newest
        :data:`BODY_SCAN` messages of each side matching the other filters.
        ``tenant``: a tenant's external id, or :data:`~outbox.admin.NO_TENANT`."""
        params = {
            "key": key,
            "event_type": event_type,
            "endpoint_id": endpoint_id,
            "state": state,
            "created_from": created_from,
            "created_until": created_until,
            "body": None if body is None else body.encode("utf-8"),
            "tenant": tenant,
            "before": before,
            "after": after,
            "scan": limit if body is None else max(BODY_SCAN, limit),
            "limit": limit,
        }
        name = "ui_messages" if after is None else "ui_messages_newer"
        found = run_sync(conn, rows_plan(ui_queries(self.schema)[name], params, Found))
        return found if after is None else found[::-1]
