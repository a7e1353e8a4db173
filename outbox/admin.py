"""Operator functions: inspect and redrive the outbox.

Dead letters are here; replay lives in ``outbox._replay``, inspection in
``outbox._inspect``, both exported here too. Everything runs in the caller's
transaction and never commits; bad input raises :class:`outbox.InvalidArgument`
before anything is written. Attempt numbers are never reused: a message sent
again keeps its ``attempts`` and gets a higher ``max_attempts``.

Design: docs/explanation/design/admin.md
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from outbox._arguments import check_budget, check_event_type_filter, check_id, check_since
from outbox._endpoint_fields import check_tenant_id
from outbox._expunge import EXPUNGED_BODY, Expunged, expunge
from outbox._inspect import AttemptInfo, MessageInfo, message_show, status
from outbox._queries import Statement, queries_for
from outbox._replay import (
    TEST_EVENT_TYPE,
    ReplayedEvent,
    replay,
    replay_event,
    replay_message,
    send_test_event,
)
from outbox._transaction import Plan, rows_plan, run_sync, scalar_plan
from outbox.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_SCHEMA, DEFAULT_WEBHOOK_MAX_ATTEMPTS
from outbox.errors import InvalidArgument, InvalidMessage

__all__ = [
    "CANCELLED",
    "EXPUNGED_BODY",
    "MAX_DEAD_LIST",
    "NO_TENANT",
    "TEST_EVENT_TYPE",
    "AttemptInfo",
    "DeadMessage",
    "Expunged",
    "MessageInfo",
    "ReplayedEvent",
    "dead_count",
    "dead_list",
    "dead_missing",
    "dead_purge",
    "dead_retry",
    "expunge",
    "message_cancel",
    "message_show",
    "replay",
    "replay_event",
    "replay_message",
    "send_test_event",
    "status",
]

MAX_DEAD_LIST = 10_000
"""The most rows one :func:`dead_list` call returns."""

NO_TENANT = "-"
"""The ``tenant`` that selects the dead messages of no tenant: those enqueued
to a URL, and those of the endpoints that belong to no tenant (never a
tenant's id, which starts with a letter or a digit)."""


@dataclass(frozen=True)
class DeadMessage:
    """One dead message, as :func:`dead_list` shows it.

    ``url`` is the message's URL or its endpoint's; ``endpoint_id`` is kept
    (from the message's target) after its endpoint was deleted.
    """

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

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "idempotency_key": self.idempotency_key,
            "url": self.url,
            "endpoint_id": self.endpoint_id,
            "event_type": self.event_type,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "last_status": self.last_status,
            "last_error": self.last_error,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
        }


def _check_ids(ids: object) -> list[int] | None:
    """Message ids, each once, in order (None for none)."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
        raise InvalidArgument("ids", "must be a list of message ids")
    return sorted({check_id(i, "ids") for i in ids}) or None


def _check_tenant(tenant: str | None) -> str | None:
    """A tenant's external id, or :data:`NO_TENANT`, or None (any)."""
    if tenant is None or tenant == NO_TENANT:
        return tenant
    try:
        return check_tenant_id(tenant)
    except InvalidMessage as exc:  # an argument here, not a field of a message
        raise InvalidArgument("tenant", f"{exc.problem}, or {NO_TENANT!r} for none") from None


def _selection(
    *,
    ids: Iterable[int] | None,
    endpoint_id: int | None,
    event_type: str | None,
    since: datetime | None,
    tenant: str | None,
    all_: bool,
) -> dict[str, Any]:
    """Parameters selecting dead messages; refuses an empty selection, so that
    forgetting an argument never touches every dead message."""
    params = {
        "ids": None if ids is None else _check_ids(ids),
        "endpoint_id": None if endpoint_id is None else check_id(endpoint_id, "endpoint_id"),
        "event_type": None if event_type is None else check_event_type_filter(event_type),
        "since": check_since(since),
        "tenant": _check_tenant(tenant),
    }
    narrowed = any(v is not None for v in params.values())
    if all_ and narrowed:
        raise InvalidArgument("all_", "cannot be combined with ids or filters")
    if not all_ and not narrowed:
        raise InvalidArgument(
            "ids",
            "give message ids, a filter (endpoint_id, event_type, since, tenant) or all_=True",
        )
    return params


# -- cancelling ---------------------------------------------------------------

CANCELLED = "cancelled by an operator"
"""The last error of a message :func:`message_cancel` cancelled without a reason."""


def message_cancel(
    tx: Any, ids: Iterable[int], *, schema: str = DEFAULT_SCHEMA, reason: str = CANCELLED
) -> list[int]:
    """Cancel waiting messages: each of ``ids`` that is ready (due or scheduled)
    or paused becomes dead with ``reason`` as its last error, and is never sent
    unless retried as a dead letter (:func:`dead_retry`; :func:`dead_purge`
    deletes it). A running message is passed over: a dispatcher holds it and may
    be sending it. Return the ids cancelled, in order."""
    id_list = _check_ids(ids)
    if id_list is None:
        return []
    if not isinstance(reason, str) or not reason.strip() or "\x00" in reason:
        raise InvalidArgument("reason", "must be a non-empty text without NUL")
    params = {"ids": id_list, "reason": reason}
    rows = run_sync(
        tx, rows_plan(queries_for(schema)["message_cancel"], params, _Id), schema=schema
    )
    return sorted(row.id for row in rows)


# -- dead letters ------------------------------------------------------------


def dead_list(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    endpoint_id: int | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    tenant: str | None = None,
    limit: int = 100,
) -> list[DeadMessage]:
    """Dead messages, newest first (by when they died).

    :param endpoint_id: only messages of this endpoint (also after it was deleted).
    :param event_type: only messages of this event type.
    :param since: only messages that died at or after this aware datetime.
    :param tenant: only messages of this tenant's endpoints (its external id),
        or with :data:`NO_TENANT`, only those of no tenant. A message whose
        endpoint was deleted matches neither: whose it was is not recorded.
    :param limit: at most this many (1 to :data:`MAX_DEAD_LIST`).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_DEAD_LIST:
        raise InvalidArgument("limit", f"must be an integer between 1 and {MAX_DEAD_LIST}")
    params = {
        "endpoint_id": None if endpoint_id is None else check_id(endpoint_id, "endpoint_id"),
        "event_type": None if event_type is None else check_event_type_filter(event_type),
        "since": check_since(since),
        "tenant": _check_tenant(tenant),
        "limit": limit,
    }
    return run_sync(
        tx, rows_plan(queries_for(schema)["dead_list"], params, DeadMessage), schema=schema
    )


def dead_missing(tx: Any, ids: Iterable[int], *, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """The ids among ``ids`` that name no dead message, in order: never written,
    purged, or not dead (waiting, running or delivered). :func:`dead_retry` and
    :func:`dead_purge` pass them over; ask first to report them."""
    id_list = _check_ids(ids)
    if id_list is None:
        return []
    found = run_sync(
        tx, rows_plan(queries_for(schema)["dead_found"], {"ids": id_list}, _Id), schema=schema
    )
    dead = {row.id for row in found}
    return [i for i in id_list if i not in dead]


class _Id(NamedTuple):
    """The row of ``dead_found``."""

    id: int


def dead_count(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    ids: Iterable[int] | None = None,
    endpoint_id: int | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    tenant: str | None = None,
    all_: bool = False,
) -> int:
    """How many dead messages :func:`dead_purge` with the same selection would
    delete (and :func:`dead_retry` would consider)."""
    params = _selection(
        ids=ids,
        endpoint_id=endpoint_id,
        event_type=event_type,
        since=since,
        tenant=tenant,
        all_=all_,
    )
    return run_sync(tx, scalar_plan(queries_for(schema)["dead_count"], params), schema=schema)


def dead_retry(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    ids: Iterable[int] | None = None,
    endpoint_id: int | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    tenant: str | None = None,
    all_: bool = False,
    budget: int | None = None,
    notify: bool = True,
) -> int:
    """Send dead messages again; return how many were redriven.

    Select by ``ids``, by filters (``endpoint_id``, ``event_type``, ``since``,
    ``tenant``, as :func:`dead_list` takes them: all given ones must match), or
    every dead message with ``all_=True``; a call with none of them raises
    :class:`InvalidArgument`. Each message goes back to
    ``ready`` now, with the same id and idempotency key (the receiver dedupes a
    delivery that did land before), its ``attempts`` kept and ``max_attempts``
    raised to ``attempts + budget``. ``budget`` defaults to the default budget
    of the message's kind (8 for webhooks, 12 for URL messages): the budget a
    message was enqueued with is not recorded once it has been raised.

    A message of a disabled endpoint becomes ``paused`` instead (enabling the
    endpoint resumes it); one whose endpoint was deleted stays dead and is not
    counted. ``notify`` wakes listening dispatchers when ``tx`` commits.
    """
    params = _selection(
        ids=ids,
        endpoint_id=endpoint_id,
        event_type=event_type,
        since=since,
        tenant=tenant,
        all_=all_,
    )
    params["budget"] = DEFAULT_MAX_ATTEMPTS if budget is None else check_budget(budget)
    params["webhook_budget"] = DEFAULT_WEBHOOK_MAX_ATTEMPTS if budget is None else params["budget"]
    name = "dead_retry_notify" if notify else "dead_retry"
    return run_sync(tx, _retry_plan(queries_for(schema)[name], params), schema=schema)


class _Retried(NamedTuple):
    """The row of ``dead_retry``: messages made ready or paused, and of those the
    paused ones."""

    retried: int
    paused: int
    notified: None = None


def _retry_plan(statement: Statement, params: dict[str, Any]) -> Plan[int]:
    rows = yield from rows_plan(statement, params, _Retried)
    return rows[0].retried


def dead_purge(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    ids: Iterable[int] | None = None,
    endpoint_id: int | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    tenant: str | None = None,
    all_: bool = False,
) -> int:
    """Delete dead messages and their attempt rows; return how many.

    The selection works as in :func:`dead_retry`. The idempotency keys stay
    recorded (``message_keys`` is not touched): a dead message may have had its
    effect (a request that timed out after the receiver applied it), so
    enqueuing the same key for the same target again must still be a no-op that
    returns the purged message's id, as it would had the message been kept.
    """
    params = _selection(
        ids=ids,
        endpoint_id=endpoint_id,
        event_type=event_type,
        since=since,
        tenant=tenant,
        all_=all_,
    )
    return run_sync(tx, scalar_plan(queries_for(schema)["dead_purge"], params), schema=schema)


# -- replay ------------------------------------------------------------------
