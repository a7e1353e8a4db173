"""Erasure: what messages said replaced with a marker, the record kept.

:func:`expunge` serves a request to erase a person's data (GDPR's right to
erasure) without losing the delivery record: the chosen messages' bodies and
headers, and their receivers' answers, are replaced in the hot table and the
history; ids, keys, times, states, statuses and digests stay. A message that
was waiting is cancelled (dead, "expunged before delivery"), so the marker is
never sent; one being sent is left alone and counted. An expunged event or
message is refused by every replay, and a dead one is never retried.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, NamedTuple

from outbox._arguments import check_id, check_since
from outbox._endpoint_fields import check_tenant_id
from outbox._message import MAX_KEY_LENGTH
from outbox._queries import queries_for
from outbox._storable import check_text
from outbox._transaction import Plan, rows_plan, run_sync
from outbox.defaults import DEFAULT_SCHEMA
from outbox.errors import InvalidArgument, InvalidMessage

__all__ = ["EXPUNGED_BODY", "Expunged", "expunge"]

EXPUNGED_BODY = b'{"expunged":true}'
"""The body an expunged message keeps in place of its own."""


class Expunged(NamedTuple):
    """What :func:`expunge` changed: messages of the hot table, history rows,
    waiting messages it cancelled (among ``messages``), and those it left alone
    because a dispatcher was sending them; ``id`` of its row in ``expunges``."""

    messages: int
    history: int
    cancelled: int
    running: int
    id: int


class _Row(NamedTuple):
    messages: int
    history: int
    cancelled: int
    running: int
    event_found: bool
    expunge_id: int | None


def _key(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(field, "must be a non-empty string")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidArgument(field, f"is longer than {MAX_KEY_LENGTH} characters")
    return check_text(value, field, error=InvalidArgument)


def expunge(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    event_key: str | None = None,
    tenant: str | None = None,
    endpoint_id: int | None = None,
    before: datetime | None = None,
    idempotency_key: str | None = None,
) -> Expunged:
    """Replace what the chosen messages said with a marker, keeping their record.

    Choose exactly one of: ``event_key`` (the event published under it, for
    ``tenant`` or for none: every message it wrote, waiting or delivered, and
    the event's record, which then refuses replays); ``endpoint_id`` with
    ``before`` (an endpoint's messages created before that time); or
    ``idempotency_key`` (every message with that key, whatever its target).
    Runs in the caller's transaction; returns the counts, also recorded in the
    ``expunges`` table. An event key with no record is refused naming
    ``event_key``, and nothing is written.
    """
    given = [
        name
        for name, value in (
            ("event_key", event_key),
            ("endpoint_id", endpoint_id),
            ("idempotency_key", idempotency_key),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise InvalidArgument(
            "event_key",
            "give exactly one of event_key, endpoint_id (with before) or idempotency_key",
        )
    params: dict[str, Any] = {
        "event_key": None,
        "tenant": None,
        "endpoint_id": None,
        "before": None,
        "key": None,
    }
    if tenant is not None and event_key is None:
        raise InvalidArgument("tenant", "goes with event_key only")
    if before is not None and endpoint_id is None:
        raise InvalidArgument("before", "goes with endpoint_id only")
    selector: dict[str, object]
    if event_key is not None:
        params["event_key"] = _key(event_key, "event_key")
        try:
            params["tenant"] = None if tenant is None else check_tenant_id(tenant)
        except InvalidMessage as exc:
            raise InvalidArgument(exc.field, exc.problem) from None
        scope, selector = "event", {"event_key": event_key, "tenant": tenant}
    elif endpoint_id is not None:
        params["endpoint_id"] = check_id(endpoint_id, "endpoint_id")
        params["before"] = check_since(before, "before")
        if params["before"] is None:
            raise InvalidArgument("before", "is required with endpoint_id")
        scope = "endpoint"
        selector = {"endpoint_id": endpoint_id, "before": params["before"].isoformat()}
    else:
        params["key"] = _key(idempotency_key, "idempotency_key")
        scope, selector = "key", {"idempotency_key": idempotency_key}
    params |= {"scope": scope, "selector": json.dumps(selector), "marker": EXPUNGED_BODY}
    return run_sync(tx, _expunge_plan(schema, params), schema=schema)


def _expunge_plan(schema: str, params: dict[str, Any]) -> Plan[Expunged]:
    (row,) = yield from rows_plan(queries_for(schema)["expunge"], params, _Row)
    if params["event_key"] is not None and not row.event_found:
        raise InvalidArgument(
            "event_key",
            "no event is recorded under this key (never published, published for another "
            "tenant, or before the retention period)",
        )
    assert row.expunge_id is not None  # recorded whenever something was chosen
    return Expunged(row.messages, row.history, row.cancelled, row.running, row.expunge_id)
