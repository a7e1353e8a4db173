"""The dashboard's database access: a small pool, read-only pages, written actions.

Each page or action runs in a worker thread on a pooled connection, so a slow
query never blocks the event loop. A connection is checked before each use and
waited for at most :data:`~dispatchers.ui.limits.CONNECTION_WAIT` seconds: while
the database is unreachable a request fails within that bound (a
``psycopg_pool.PoolTimeout``, answered 503 by the surfaces), and the pool
connects again, on demand, once it is back. Every page runs in a ``READ ONLY``
transaction: a page cannot write, whatever its code does; only
:meth:`DashboardStore.write` can, and the dashboard never calls it in read-only
mode. What a page reads, it reads through :mod:`dispatchers.store.web` and the
library's operator functions (:mod:`outbox.admin`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from dispatchers.store.web import activity, endpoints
from dispatchers.store.web.activity import Minute
from dispatchers.store.web.endpoints import Listed
from dispatchers.ui.limits import CONNECTION_WAIT
from outbox.admin import NO_TENANT
from outbox.tenants import Tenant, Tenants

T = TypeVar("T")

SEARCH_LIMIT = 100
"""The most messages one search shows."""

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
            rows = activity.hours(conn, self.schema, since=since, until=until)
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

    def tenant(self, conn: psycopg.Connection[Any], external_id: str) -> Tenant | None:
        """The tenant of ``external_id`` (checked already), or None if there is none."""
        return Tenants(schema=self.schema).get(conn, external_id)

    def unknown_tenant(self, conn: psycopg.Connection[Any], tenant: str | None) -> str | None:
        """``tenant``, a filter's, if it names no tenant (a page then says so
        rather than only that nothing matches); else None."""
        if tenant is None or tenant == NO_TENANT:
            return None
        return tenant if self.tenant(conn, tenant) is None else None

    def tenant_filter(
        self, conn: psycopg.Connection[Any], tenant: str | None
    ) -> tuple[int | None, bool] | None:
        """A page's filter by ``tenant`` (an external id, or
        :data:`~outbox.admin.NO_TENANT`) as the store's scope and its filter of
        the endpoints of no tenant; None if it names no tenant (nothing matches)."""
        if tenant is None:
            return None, False
        if tenant == NO_TENANT:
            return None, True
        found = endpoints.tenant_id(conn, self.schema, tenant)
        return None if found is None else (found, False)

    def endpoint_page(
        self,
        conn: psycopg.Connection[Any],
        *,
        tenant: str | None,
        limit: int,
        after: int = 0,
        attention: bool = False,
    ) -> list[Listed]:
        """Up to ``limit`` endpoints after id ``after``, by id, with their backlog:
        those of ``tenant`` only (an external id, or :data:`~outbox.admin.NO_TENANT`)
        if given, those that need attention only if asked."""
        scope = self.tenant_filter(conn, tenant)
        if scope is None:
            return []
        tenant_id, untenanted = scope
        page = endpoints.page(
            conn,
            self.schema,
            tenant_id=tenant_id,
            untenanted=untenanted,
            after=after,
            attention=attention,
            limit=limit,
        )
        return endpoints.listed(conn, self.schema, page, tenant_id=tenant_id)
