"""Delivery attempts as the web surfaces show them (``sql/attempts.sql``): one
row, :class:`Attempt`, for a message's attempts (the API's detail, the portal)
and an endpoint's latest (the dashboard). Every function takes the scope
``tenant_id`` (None: the operator's); a tenant sees the attempts of its messages
only, without the dispatcher that made each (``owner`` is None).
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from dispatchers.store.web import Conn, rows

RECENT_ATTEMPTS = 20
"""The most attempts of an endpoint's last hour one page lists."""


class Attempt(NamedTuple):
    """An attempt as shown (a row of ``web_message_attempts`` and ``web_endpoint_attempts``)."""

    message_id: int
    attempt: int
    owner: str | None
    """The dispatcher that made it (host name and pid); None to a tenant."""
    started_at: datetime
    duration_ms: int | None
    status: int | None
    outcome: str
    error_class: str | None
    error: str | None
    """Its error, as recorded."""
    response_excerpt: str | None
    """The excerpt of the receiver's reply, as recorded."""


def of_message(conn: Conn, schema: str, message_id: int, *, tenant_id: int | None) -> list[Attempt]:
    """The attempts of the message, in order (none for one out of scope)."""
    params = {"id": message_id, "tenant_id": tenant_id}
    return rows(conn, schema, "web_message_attempts", params, Attempt)


def of_endpoint(
    conn: Conn,
    schema: str,
    endpoint_id: int,
    *,
    tenant_id: int | None,
    limit: int = RECENT_ATTEMPTS,
) -> list[Attempt]:
    """The endpoint's latest attempts of the last hour, newest first."""
    params = {"endpoint_id": endpoint_id, "tenant_id": tenant_id, "limit": limit}
    return rows(conn, schema, "web_endpoint_attempts", params, Attempt)
