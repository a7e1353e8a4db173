"""Messages as the web surfaces show them (``sql/messages.sql``): one summary
row, :class:`MessageSummary`, for a search (the API's list, the dashboard's
search) and a tenant's latest deliveries (the portal); one message with its
body, :class:`Message`; the dead letters, :class:`Dead`.

Every function takes the scope ``tenant_id`` (None: the operator's, every
message): a tenant's are those of its endpoints, and a message without an
endpoint, or whose endpoint was deleted, is the operator's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from dispatchers.store.web import Conn, rows
from outbox.internal import scalar

BODY_SCAN = 5000
"""The most messages of the queue, and of the history, whose bodies one search
for a text in bodies reads: the newest that match the other filters, before
the page's cursor."""


class MessageSummary(NamedTuple):
    """A message in a list (a row of ``web_messages`` and ``web_deliveries``)."""

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
    last_error: str | None
    """The start of its last error (None for a delivered message)."""
    created_at: datetime
    completed_at: datetime | None
    held: bool
    """Ready, but its destination's breaker is open or a Retry-After holds it."""


class Message(NamedTuple):
    """One message with its body (the row of ``web_message``)."""

    id: int
    idempotency_key: str
    """The ``webhook-id`` its receiver gets."""
    endpoint_id: int | None
    """Kept (from its target) after its endpoint was deleted."""
    url: str | None
    method: str
    header_names: list[str]
    """The names of its headers, not their values."""
    content_type: str
    event_type: str | None
    ordering_key: str | None
    state: str
    attempts: int
    max_attempts: int
    available_at: datetime | None
    last_status: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None
    body: bytes


class Dead(NamedTuple):
    """A dead letter (a row of ``web_dead_page``)."""

    id: int
    idempotency_key: str
    url: str | None
    endpoint_id: int | None
    event_type: str | None
    attempts: int
    max_attempts: int
    last_status: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None


def search(
    conn: Conn,
    schema: str,
    *,
    tenant_id: int | None,
    key: str | None = None,
    event_type: str | None = None,
    endpoint_id: int | None = None,
    state: str | None = None,
    created_from: datetime | None = None,
    created_until: datetime | None = None,
    body: str | None = None,
    untenanted: bool = False,
    before: int | None = None,
    after: int | None = None,
    limit: int,
) -> list[MessageSummary]:
    """Up to ``limit`` messages in scope matching every filter given, newest
    first: older than id ``before``, or the newest just newer than id ``after``.
    ``body``: text to find in bodies, looked for in the newest :data:`BODY_SCAN`
    messages of each side matching the other filters; ``untenanted``: those of
    no tenant only."""
    params = {
        "tenant_id": tenant_id,
        "key": key,
        "event_type": event_type,
        "endpoint_id": endpoint_id,
        "state": state,
        "created_from": created_from,
        "created_until": created_until,
        "body": None if body is None else body.encode("utf-8"),
        "untenanted": untenanted,
        "before": before,
        "after": after,
        "scan": limit if body is None else max(BODY_SCAN, limit),
        "limit": limit,
    }
    if after is None:
        return rows(conn, schema, "web_messages", params, MessageSummary)
    return rows(conn, schema, "web_messages_newer", params, MessageSummary)[::-1]


def deliveries(
    conn: Conn, schema: str, *, tenant_id: int | None, endpoint_id: int | None = None, limit: int
) -> list[MessageSummary]:
    """The newest messages in scope (of one endpoint, if given), waiting or
    done, by creation: at most ``limit``."""
    params = {"tenant_id": tenant_id, "endpoint_id": endpoint_id, "limit": limit}
    return rows(conn, schema, "web_deliveries", params, MessageSummary)


def _message(*, body: bytes | memoryview, **columns: Any) -> Message:
    return Message(body=bytes(body), **columns)


def get(conn: Conn, schema: str, message_id: int, *, tenant_id: int | None) -> Message | None:
    """The message with its body, or None (missing, purged, or out of scope)."""
    found = rows(conn, schema, "web_message", {"id": message_id, "tenant_id": tenant_id}, _message)
    return found[0] if found else None


def visible(conn: Conn, schema: str, message_id: int, *, tenant_id: int | None) -> bool:
    """Whether message ``message_id`` (waiting, dead or delivered) is in scope."""
    params = {"id": message_id, "tenant_id": tenant_id}
    return bool(rows(conn, schema, "web_message_visible", params, scalar)[0])


def dead_page(
    conn: Conn,
    schema: str,
    *,
    tenant_id: int | None,
    endpoint_id: int | None,
    event_type: str | None,
    since: datetime | None,
    untenanted: bool = False,
    before: int,
    limit: int,
) -> list[Dead]:
    """Up to ``limit`` dead letters in scope matching every filter given,
    newest first, before id ``before``; ``untenanted``: those of no tenant only."""
    params = {
        "tenant_id": tenant_id,
        "endpoint_id": endpoint_id,
        "event_type": event_type,
        "since": since,
        "untenanted": untenanted,
        "before": before,
        "limit": limit,
    }
    return rows(conn, schema, "web_dead_page", params, Dead)


def dead_ids(
    conn: Conn,
    schema: str,
    *,
    tenant_id: int | None,
    ids: list[int] | None,
    endpoint_id: int | None,
    event_type: str | None,
    since: datetime | None,
    limit: int,
) -> list[int]:
    """The ids of the dead letters in scope of a selection, at most ``limit``."""
    params = {
        "tenant_id": tenant_id,
        "ids": ids,
        "endpoint_id": endpoint_id,
        "event_type": event_type,
        "since": since,
        "limit": limit,
    }
    return [int(i) for i in rows(conn, schema, "web_dead_ids", params, scalar)]
