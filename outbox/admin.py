"""Operator functions: inspect and redrive the outbox.

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

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from outbox.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_SCHEMA, DEFAULT_WEBHOOK_MAX_ATTEMPTS
from outbox.endpoints import check_event_type
from outbox.errors import InvalidArgument, InvalidMessage
from outbox.message import MAX_ATTEMPTS_LIMIT
from outbox.queries import Statement, queries_for
from outbox.transaction import Plan, run_sync, scalar

__all__ = [
    "MAX_DEAD_LIST",
    "AttemptInfo",
    "DeadMessage",
    "MessageInfo",
    "dead_count",
    "dead_list",
    "dead_purge",
    "dead_retry",
    "message_show",
    "replay",
    "status",
]

T = TypeVar("T")

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


@dataclass(frozen=True)
class AttemptInfo:
    """One recorded delivery attempt."""

    attempt: int
    owner: str
    started_at: datetime
    duration_ms: int | None
    status: int | None
    outcome: str
    error_class: str | None
    error: str | None
    response_excerpt: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "owner": self.owner,
            "started_at": self.started_at,
            "duration_ms": self.duration_ms,
            "status": self.status,
            "outcome": self.outcome,
            "error_class": self.error_class,
            "error": self.error,
            "response_excerpt": self.response_excerpt,
        }


@dataclass(frozen=True)
class MessageInfo:
    """A message from the hot table or (``state == "succeeded"``) the history,
    with its attempts in order. ``headers`` and ``body`` may hold credentials and
    personal data: show them only when asked to."""

    id: int
    idempotency_key: str
    target: str
    endpoint_id: int | None
    url: str | None
    method: str
    headers: dict[str, str] = field(repr=False)
    body: bytes = field(repr=False)
    content_type: str
    event_type: str | None
    ordering_key: str | None
    state: str
    attempts: int
    max_attempts: int
    available_at: datetime | None
    lease_owner: str | None
    lease_until: datetime | None
    last_status: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None
    attempt_log: list[AttemptInfo]

    def as_dict(self, *, show_headers: bool = False, show_body: bool = False) -> dict[str, Any]:
        """A JSON-friendly view; header values and the body only when asked for."""
        data: dict[str, Any] = {
            "id": self.id,
            "idempotency_key": self.idempotency_key,
            "target": self.target,
            "endpoint_id": self.endpoint_id,
            "url": self.url,
            "method": self.method,
            "headers": {k: v if show_headers else "…" for k, v in self.headers.items()},
            "content_type": self.content_type,
            "body_bytes": len(self.body),
            "event_type": self.event_type,
            "ordering_key": self.ordering_key,
            "state": self.state,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "available_at": self.available_at,
            "lease_owner": self.lease_owner,
            "lease_until": self.lease_until,
            "last_status": self.last_status,
            "last_error": self.last_error,
            "created_at": self.created_at,
            "completed_at": self.completed_at,
            "attempt_log": [a.as_dict() for a in self.attempt_log],
        }
        if show_body:
            try:
                data["body"] = self.body.decode("utf-8")
            except UnicodeDecodeError:
                data["body_hex"] = self.body.hex()
        return data


# -- validation --------------------------------------------------------------


def _check_id(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(field, f"must be a positive integer, not {value!r}")
    return value


def _check_event_type(value: object) -> str:
    """An event type to filter by: the rule of an event's type, for an argument."""
    try:
        return check_event_type(value)
    except InvalidMessage as exc:
        raise InvalidArgument(exc.field, exc.problem) from None


def _check_since(value: object, field: str = "since") -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidArgument(field, "must be a timezone-aware datetime")
    return value


def _check_budget(value: object, field: str = "budget") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer, not {type(value).__name__}")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument(field, f"must be between 1 and {MAX_ATTEMPTS_LIMIT}")
    return value


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
    id_list: list[int] | None = None
    if ids is not None:
        if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
            raise InvalidArgument("ids", "must be a list of message ids")
        id_list = sorted({_check_id(i, "ids") for i in ids}) or None
    params = {
        "ids": id_list,
        "endpoint_id": None if endpoint_id is None else _check_id(endpoint_id, "endpoint_id"),
        "event_type": None if event_type is None else _check_event_type(event_type),
        "since": _check_since(since),
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
        "endpoint_id": None if endpoint_id is None else _check_id(endpoint_id, "endpoint_id"),
        "event_type": None if event_type is None else _check_event_type(event_type),
        "since": _check_since(since),
        "limit": limit,
    }
    return run_sync(tx, _rows_plan(queries_for(schema)["dead_list"], params, DeadMessage))


def _rows_plan(
    statement: Statement, params: dict[str, Any], row: Callable[..., T]
) -> Plan[list[T]]:
    rows: list[T] = yield statement, params, row
    return rows


def _scalar_plan(statement: Statement, params: dict[str, Any]) -> Plan[int]:
    rows = yield from _rows_plan(statement, params, scalar)
    return int(rows[0])


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
    return run_sync(tx, _scalar_plan(queries_for(schema)["dead_count"], params))


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
    params["budget"] = DEFAULT_MAX_ATTEMPTS if budget is None else _check_budget(budget)
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
    rows = yield from _rows_plan(statement, params, _Retried)
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
    return run_sync(tx, _scalar_plan(queries_for(schema)["dead_purge"], params))


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
    endpoint_id = _check_id(endpoint_id, "endpoint_id")
    checked_since = _check_since(since)
    if checked_since is None:
        raise InvalidArgument("since", "is required")
    checked_until = _check_since(until, "until")
    if checked_until is not None and checked_until <= checked_since:
        raise InvalidArgument("until", "must be later than since")
    params = {
        "endpoint_id": endpoint_id,
        "since": checked_since,
        "until": checked_until,
        "budget": _check_budget(budget),
    }
    return run_sync(tx, _replay_plan(schema, params, notify))


def _replay_plan(schema: str, params: dict[str, Any], notify: bool) -> Plan[int]:
    queries = queries_for(schema)
    endpoint_id = params["endpoint_id"]
    endpoints = yield from _rows_plan(
        queries["replay_endpoint"], {"endpoint_id": endpoint_id}, _ReplayEndpoint
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
    return (yield from _scalar_plan(queries["replay_notify" if notify else "replay"], params))


class _ReplayEndpoint(NamedTuple):
    """The row of ``replay_endpoint``."""

    id: int
    enabled: bool
    disabled_reason: str | None


# -- inspection --------------------------------------------------------------


def _headers(value: object) -> dict[str, str]:
    if isinstance(value, str | bytes):  # drivers that do not decode jsonb
        value = json.loads(value)
    return dict(value) if isinstance(value, Mapping) else {}


def message_show(tx: Any, message_id: int, *, schema: str = DEFAULT_SCHEMA) -> MessageInfo | None:
    """The message (waiting, in flight, paused, dead, or delivered) with its
    attempts; None if no message has this id (never written, or purged)."""
    return run_sync(tx, _show_plan(schema, _check_id(message_id, "message_id")))


def _show_plan(schema: str, message_id: int) -> Plan[MessageInfo | None]:
    queries = queries_for(schema)
    rows = yield from _rows_plan(queries["message_get"], {"id": message_id}, _message_row)
    if not rows:
        return None
    attempts = yield from _rows_plan(queries["message_attempts"], {"id": message_id}, AttemptInfo)
    return dataclasses.replace(rows[0], attempt_log=attempts)


def _message_row(*, headers: object, body: bytes | memoryview, **columns: Any) -> MessageInfo:
    """A row of ``message_get``, without its attempts (read next)."""
    return MessageInfo(headers=_headers(headers), body=bytes(body), attempt_log=[], **columns)


def status(tx: Any, *, schema: str = DEFAULT_SCHEMA) -> dict[str, Any]:
    """A snapshot of the outbox, as a JSON-friendly dict.

    - ``messages``: counts by state: ``ready`` (due now), ``scheduled`` (due
      later), ``running`` (live lease), ``lease_expired`` (running past the lease:
      the dispatcher died or froze; the rescuer returns them), ``paused``, ``dead``;
    - ``oldest_ready_age_s``: seconds the oldest due message has waited since it
      became due (None when nothing is due), the dispatch lag;
    - ``last_5_minutes``: attempts started in the last five minutes that
      ``delivered`` or ``failed`` (retried, dead, or lost their lease);
    - ``endpoints``: per endpoint ``id``, ``url``, ``enabled``,
      ``disabled_reason``, ``failure_streak``, ``pending`` (ready, running or
      paused messages), ``dead``, ``last_success_at``;
    - ``now``: the database's clock.
    """
    return run_sync(tx, _status_plan(schema))


def _status_plan(schema: str) -> Plan[dict[str, Any]]:
    queries = queries_for(schema)
    counts = yield from _rows_plan(queries["status_counts"], {}, _StatusCounts)
    c = counts[0]
    endpoints = yield from _rows_plan(queries["status_endpoints"], {}, _EndpointStatus)
    return {
        "messages": {
            "ready": c.ready,
            "scheduled": c.scheduled,
            "running": c.running,
            "lease_expired": c.lease_expired,
            "paused": c.paused,
            "dead": c.dead,
        },
        "oldest_ready_age_s": (
            None if c.oldest_ready_age_s is None else max(0.0, float(c.oldest_ready_age_s))
        ),
        "last_5_minutes": {"delivered": c.delivered, "failed": c.failed},
        "endpoints": [e._asdict() for e in endpoints],
        "now": c.now,
    }


class _StatusCounts(NamedTuple):
    """The row of ``status_counts``: messages by state, lag, recent attempts."""

    ready: int
    scheduled: int
    running: int
    lease_expired: int
    paused: int
    dead: int
    oldest_ready_age_s: float | None
    delivered: int
    failed: int
    now: datetime


class _EndpointStatus(NamedTuple):
    """A row of ``status_endpoints``, as ``status`` reports it."""

    id: int
    url: str
    enabled: bool
    disabled_reason: str | None
    failure_streak: int
    pending: int
    dead: int
    last_success_at: datetime | None
