"""What the consumer portal reads, each statement scoped to one tenant.

The statements are those of ``dispatchers/portal/queries.sql``
(:func:`portal_queries`); each takes the tenant's key and finds nothing of any
other tenant, so an id guessed from another tenant reads as a missing one.
They run on the dashboard's connections (:class:`~dispatchers.ui.store.DashboardStore`),
in its read-only transactions for pages.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from outbox.internal import Queries, catalog, rows_plan, run_sync, scalar

QUERIES = Path(__file__).with_name("queries.sql")
"""The portal's statements (shipped in the wheel with the package)."""

LISTED = 100
"""The most endpoints, and messages, one page lists."""


def portal_queries(schema: str) -> Queries:
    """The portal's statements bound to ``schema`` (cached by the loader)."""
    return catalog(schema, (QUERIES,))


class TenantEndpoint(NamedTuple):
    """A row of ``consumer_endpoints`` and ``consumer_endpoint``."""

    id: int
    url: str
    description: str
    event_types: list[str]
    enabled: bool
    disabled_reason: str | None
    failure_streak: int
    failing_since: datetime | None
    last_success_at: datetime | None
    created_at: datetime
    secrets: Any
    """jsonb: ``[{"secret", "key_id", "expires_at"}]`` in force, as stored, newest first."""
    pending: int
    dead: int


class Delivery(NamedTuple):
    """A row of ``consumer_deliveries``: one message, waiting or done."""

    id: int
    endpoint_id: int
    url: str
    event_type: str | None
    state: str
    attempts: int
    last_status: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None


class TenantMessage(NamedTuple):
    """The row of ``consumer_message``."""

    id: int
    idempotency_key: str
    """The ``webhook-id`` its receiver gets."""
    endpoint_id: int
    url: str
    event_type: str | None
    state: str
    attempts: int
    max_attempts: int
    available_at: datetime | None
    last_status: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None
    body: bytes


class Attempt(NamedTuple):
    """A row of ``consumer_attempts``."""

    attempt: int
    started_at: datetime
    duration_ms: int | None
    status: int | None
    outcome: str
    error_class: str | None
    error: str | None
    response_excerpt: str | None


Conn = psycopg.Connection[Any]


def endpoints(conn: Conn, schema: str, tenant_id: int) -> list[TenantEndpoint]:
    """The tenant's endpoints, by id (at most :data:`LISTED`)."""
    params = {"tenant_id": tenant_id, "limit": LISTED}
    query = portal_queries(schema)["consumer_endpoints"]
    return run_sync(conn, rows_plan(query, params, TenantEndpoint))


def endpoint(conn: Conn, schema: str, tenant_id: int, endpoint_id: int) -> TenantEndpoint | None:
    """The tenant's endpoint, or None (missing, or another's)."""
    params = {"tenant_id": tenant_id, "id": endpoint_id}
    query = portal_queries(schema)["consumer_endpoint"]
    rows = run_sync(conn, rows_plan(query, params, TenantEndpoint))
    return rows[0] if rows else None


def owns_endpoint(conn: Conn, schema: str, tenant_id: int, endpoint_id: int) -> bool:
    """Whether the endpoint is the tenant's."""
    params = {"tenant_id": tenant_id, "id": endpoint_id}
    query = portal_queries(schema)["consumer_endpoint_owned"]
    return bool(run_sync(conn, rows_plan(query, params, scalar)))


def deliveries(
    conn: Conn, schema: str, tenant_id: int, *, endpoint_id: int | None = None
) -> list[Delivery]:
    """The tenant's newest messages (of one of its endpoints, if given), waiting
    or done: at most :data:`LISTED`."""
    params = {"tenant_id": tenant_id, "endpoint_id": endpoint_id, "limit": LISTED}
    query = portal_queries(schema)["consumer_deliveries"]
    return run_sync(conn, rows_plan(query, params, Delivery))


def message(conn: Conn, schema: str, tenant_id: int, message_id: int) -> TenantMessage | None:
    """The tenant's message, or None (missing, purged, or another's)."""
    params = {"tenant_id": tenant_id, "id": message_id}
    rows = run_sync(conn, rows_plan(portal_queries(schema)["consumer_message"], params, _message))
    return rows[0] if rows else None


def _message(*, body: bytes | memoryview, **columns: Any) -> TenantMessage:
    return TenantMessage(body=bytes(body), **columns)


def attempts(conn: Conn, schema: str, tenant_id: int, message_id: int) -> list[Attempt]:
    """The attempts of the tenant's message, in order (none for another's)."""
    params = {"tenant_id": tenant_id, "id": message_id}
    return run_sync(conn, rows_plan(portal_queries(schema)["consumer_attempts"], params, Attempt))


def sealed_secrets(conn: Conn, schema: str) -> bool:
    """Whether any signing secret is sealed."""
    query = portal_queries(schema)["consumer_sealed_secrets"]
    return bool(run_sync(conn, rows_plan(query, {}, scalar))[0])
