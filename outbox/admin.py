"""Operator functions: inspect and redrive the outbox.

Dead letters and replay are here; inspection (:func:`message_show`,
:func:`status`) lives in ``outbox._inspect`` and is exported here too.

Everything here runs in the caller's transaction (a SQLAlchemy ``Session`` or
``Connection``, or a psycopg ``Connection``) and never commits; ``outbox`` CLI
commands wrap each call in a transaction of their own. Bad input raises
:class:`outbox.InvalidArgument` naming the argument, before anything is written.

Attempt numbers are never reused. They are the fencing token of every claim and
part of the ``attempts`` table's key, so a message sent again (a dead one
retried, a delivered one replayed) keeps its ``attempts`` and gets a higher
``max_attempts`` instead: a fresh budget on top of the attempts already made.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from outbox._arguments import check_budget, check_event_type_filter, check_id, check_since
from outbox._inspect import AttemptInfo, MessageInfo, message_show, status
from outbox._queries import Statement, queries_for
from outbox._transaction import Plan, rows_plan, run_sync, scalar_plan
from outbox.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_SCHEMA, DEFAULT_WEBHOOK_MAX_ATTEMPTS
from outbox.errors import InvalidArgument

__all__ = [
    "MAX_DEAD_LIST",
    "AttemptInfo",
    "DeadMessage",
    "MessageInfo",
    "ReplayedEvent",
    "dead_count",
    "dead_list",
    "dead_missing",
    "dead_purge",
    "dead_retry",
    "message_show",
    "replay",
    "replay_event",
    "send_test_event",
    "status",
]

TEST_EVENT_TYPE = "outbox.test"
"""The event type of :func:`send_test_event`'s messages."""

MAX_DEAD_LIST = 10_000
"""The most rows one :func:`dead_list` call returns."""


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


def _selection(
    *,
    ids: Iterable[int] | None,
    endpoint_id: int | None,
    event_type: str | None,
    since: datetime | None,
    all_: bool,
) -> dict[str, Any]:
    """Parameters selecting dead messages; refuses an empty selection, so that
    forgetting an argument never touches every dead message."""
    params = {
        "ids": None if ids is None else _check_ids(ids),
        "endpoint_id": None if endpoint_id is None else check_id(endpoint_id, "endpoint_id"),
        "event_type": None if event_type is None else check_event_type_filter(event_type),
        "since": check_since(since),
    }
    narrowed = any(v is not None for v in params.values())
    if all_ and narrowed:
        raise InvalidArgument("all_", "cannot be combined with ids or filters")
    if not all_ and not narrowed:
        raise InvalidArgument(
            "ids", "give message ids, a filter (endpoint_id, event_type, since) or all_=True"
        )
    return params


# -- dead letters ------------------------------------------------------------


def dead_list(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    endpoint_id: int | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> list[DeadMessage]:
    """Dead messages, newest first (by when they died).

    :param endpoint_id: only messages of this endpoint (also after it was deleted).
    :param event_type: only messages of this event type.
    :param since: only messages that died at or after this aware datetime.
    :param limit: at most this many (1 to :data:`MAX_DEAD_LIST`).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_DEAD_LIST:
        raise InvalidArgument("limit", f"must be an integer between 1 and {MAX_DEAD_LIST}")
    params = {
        "endpoint_id": None if endpoint_id is None else check_id(endpoint_id, "endpoint_id"),
        "event_type": None if event_type is None else check_event_type_filter(event_type),
        "since": check_since(since),
        "limit": limit,
    }
    return run_sync(tx, rows_plan(queries_for(schema)["dead_list"], params, DeadMessage))


def dead_missing(tx: Any, ids: Iterable[int], *, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """The ids among ``ids`` that name no dead message, in order: never written,
    purged, or not dead (waiting, running or delivered). :func:`dead_retry` and
    :func:`dead_purge` pass them over; ask first to report them."""
    id_list = _check_ids(ids)
    if id_list is None:
        return []
    found = run_sync(tx, rows_plan(queries_for(schema)["dead_found"], {"ids": id_list}, _Id))
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
    all_: bool = False,
) -> int:
    """How many dead messages :func:`dead_purge` with the same selection would
    delete (and :func:`dead_retry` would consider)."""
    params = _selection(
        ids=ids, endpoint_id=endpoint_id, event_type=event_type, since=since, all_=all_
    )
    return run_sync(tx, scalar_plan(queries_for(schema)["dead_count"], params))


def dead_retry(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    ids: Iterable[int] | None = None,
    endpoint_id: int | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    all_: bool = False,
    budget: int | None = None,
    notify: bool = True,
) -> int:
    """Send dead messages again; return how many were redriven.

    Select by ``ids``, by filters (``endpoint_id``, ``event_type``, ``since``:
    all given ones must match), or every dead message with ``all_=True``; a call
    with none of them raises :class:`InvalidArgument`. Each message goes back to
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
        ids=ids, endpoint_id=endpoint_id, event_type=event_type, since=since, all_=all_
    )
    params["budget"] = DEFAULT_MAX_ATTEMPTS if budget is None else check_budget(budget)
    params["webhook_budget"] = DEFAULT_WEBHOOK_MAX_ATTEMPTS if budget is None else params["budget"]
    name = "dead_retry_notify" if notify else "dead_retry"
    return run_sync(tx, _retry_plan(queries_for(schema)[name], params))


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
        ids=ids, endpoint_id=endpoint_id, event_type=event_type, since=since, all_=all_
    )
    return run_sync(tx, scalar_plan(queries_for(schema)["dead_purge"], params))


# -- replay ------------------------------------------------------------------


def replay(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    endpoint_id: int,
    since: datetime,
    until: datetime | None = None,
    budget: int = DEFAULT_WEBHOOK_MAX_ATTEMPTS,
    notify: bool = True,
) -> int:
    """Send the endpoint's delivered messages again; return how many.

    Every message of ``endpoint_id`` delivered at or after ``since`` (and before
    ``until``, if given) moves from the history back to the hot table with its
    id, idempotency key and body, ready now: the same ``webhook-id`` goes out,
    so a receiver that dedupes ignores what it already processed and one that
    lost its data gets it again. ``attempts`` is kept and ``max_attempts`` is
    ``attempts + budget``. Raises :class:`InvalidArgument` for a missing or
    disabled endpoint (enable it first: a replay to a disabled endpoint would
    only pause). ``notify`` wakes listening dispatchers when ``tx`` commits.
    """
    endpoint_id = check_id(endpoint_id, "endpoint_id")
    checked_since = check_since(since)
    if checked_since is None:
        raise InvalidArgument("since", "is required")
    checked_until = check_since(until, "until")
    if checked_until is not None and checked_until <= checked_since:
        raise InvalidArgument("until", "must be later than since")
    params = {
        "endpoint_id": endpoint_id,
        "since": checked_since,
        "until": checked_until,
        "budget": check_budget(budget),
    }
    return run_sync(tx, _replay_plan(schema, params, notify))


def _replay_plan(schema: str, params: dict[str, Any], notify: bool) -> Plan[int]:
    queries = queries_for(schema)
    yield from _enabled_endpoint_plan(schema, params["endpoint_id"])
    return (yield from scalar_plan(queries["replay_notify" if notify else "replay"], params))


def _enabled_endpoint_plan(schema: str, endpoint_id: int) -> Plan[None]:
    """Raise :class:`InvalidArgument` unless the endpoint exists and is enabled
    (a replay to a disabled endpoint would only pause); lock it against deletion."""
    endpoints = yield from rows_plan(
        queries_for(schema)["replay_endpoint"], {"endpoint_id": endpoint_id}, _ReplayEndpoint
    )
    if not endpoints:
        raise InvalidArgument("endpoint_id", f"no endpoint with id {endpoint_id}")
    if not endpoints[0].enabled:
        reason = endpoints[0].disabled_reason
        raise InvalidArgument(
            "endpoint_id",
            f"endpoint {endpoint_id} is disabled{f' ({reason})' if reason else ''}; "
            "enable it first",
        )


class ReplayedEvent(NamedTuple):
    """What :func:`replay_event` did: the endpoint's message of the event, and
    whether this call wrote it (False: the endpoint had it already)."""

    id: int
    created: bool


def replay_event(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    event_key: str,
    endpoint_id: int,
    budget: int = DEFAULT_WEBHOOK_MAX_ATTEMPTS,
    notify: bool = True,
) -> ReplayedEvent:
    """Send the event published under ``event_key`` to one endpoint.

    Publishing is once per event key, whatever endpoints subscribed since: this
    is how an old event reaches an endpoint added later (or one whose message
    was purged), without going out again to the others. The endpoint gets the
    event's payload as the other endpoints did, with the ``webhook-id``
    ``<event key>:<endpoint id>``, and ``budget`` attempts; the event records the
    new message. An endpoint that has the event's message already keeps it (its
    id comes back, ``created`` False). The endpoint's subscriptions are not
    consulted: the operator chose it. Raises :class:`InvalidArgument` for a
    missing or disabled endpoint, an event key with no record (never published,
    or published longer ago than the retention period), or an event whose
    messages were all purged. ``notify`` wakes listening dispatchers when ``tx``
    commits.
    """
    if not isinstance(event_key, str) or not event_key:
        raise InvalidArgument("event_key", "must be a non-empty string")
    params = {
        "event_key": event_key,
        "endpoint_id": check_id(endpoint_id, "endpoint_id"),
        "budget": check_budget(budget),
    }
    return run_sync(tx, _replay_event_plan(schema, params, notify))


def _replay_event_plan(schema: str, params: dict[str, Any], notify: bool) -> Plan[ReplayedEvent]:
    yield from _enabled_endpoint_plan(schema, params["endpoint_id"])
    statement = queries_for(schema)["replay_event_notify" if notify else "replay_event"]
    (row,) = yield from rows_plan(statement, params, _ReplayEventRow)
    if not row.recorded:
        raise InvalidArgument(
            "event_key",
            "no event is recorded under this key (never published, or published "
            "before the retention period)",
        )
    if not row.payload or row.id is None:
        raise InvalidArgument("event_key", "the event's messages were all purged: nothing to send")
    return ReplayedEvent(row.id, row.created)


def send_test_event(
    tx: Any, *, schema: str = DEFAULT_SCHEMA, endpoint_id: int, notify: bool = True
) -> int:
    """Send one test event to an endpoint; return its message id.

    The message is a webhook like a published event's: the Standard Webhooks
    envelope of type :data:`TEST_EVENT_TYPE` (its ``data`` names the endpoint),
    a fresh ``webhook-id``, signed with the endpoint's secrets, whatever event
    types the endpoint subscribes to. It has one attempt, so its outcome (the
    receiver's status and reply, in ``messages show``) is known at once; a
    failed test is a dead message like any other. Raises
    :class:`InvalidArgument` for a missing or disabled endpoint.
    """
    endpoint_id = check_id(endpoint_id, "endpoint_id")
    envelope = {
        "type": TEST_EVENT_TYPE,
        "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "data": {"endpoint_id": endpoint_id, "message": "a test event sent by an operator"},
    }
    params = {
        "endpoint_id": endpoint_id,
        "event_key": "evt_test_" + uuid.uuid4().hex,
        "event_type": TEST_EVENT_TYPE,
        "body": json.dumps(envelope, separators=(",", ":")).encode(),
    }
    return run_sync(tx, _test_event_plan(schema, params, notify))


def _test_event_plan(schema: str, params: dict[str, Any], notify: bool) -> Plan[int]:
    yield from _enabled_endpoint_plan(schema, params["endpoint_id"])
    statement = queries_for(schema)["test_event_notify" if notify else "test_event"]
    return (yield from scalar_plan(statement, params))


class _ReplayEventRow(NamedTuple):
    """The row of ``replay_event``."""

    recorded: bool
    payload: bool
    id: int | None
    created: bool
    notified: None = None


class _ReplayEndpoint(NamedTuple):
    """The row of ``replay_endpoint``."""

    id: int
    enabled: bool
    disabled_reason: str | None
