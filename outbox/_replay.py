"""Sending again: an endpoint's delivered messages (:func:`replay`), one
delivered message (:func:`replay_message`), a recorded event to an endpoint that
did not get it (:func:`replay_event`), and a test event (:func:`send_test_event`).
Exported by :mod:`outbox.admin`, whose rules they follow: the caller's
transaction, never committed; bad input is :class:`outbox.InvalidArgument`
before anything is written; attempt numbers never reused (a message sent again
keeps its ``attempts`` and gets ``budget`` more).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any, NamedTuple

from outbox._arguments import check_budget, check_id, check_since
from outbox._message import MAX_KEY_LENGTH
from outbox._queries import queries_for
from outbox._storable import check_text
from outbox._transaction import Plan, rows_plan, run_sync, scalar_plan
from outbox.defaults import DEFAULT_SCHEMA, DEFAULT_WEBHOOK_MAX_ATTEMPTS
from outbox.errors import InvalidArgument

TEST_EVENT_TYPE = "outbox.test"
"""The event type of :func:`send_test_event`'s messages."""


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
    return run_sync(tx, _replay_plan(schema, params, notify), schema=schema)


def _replay_plan(schema: str, params: dict[str, Any], notify: bool) -> Plan[int]:
    queries = queries_for(schema)
    yield from _enabled_endpoint_plan(schema, params["endpoint_id"])
    return (yield from scalar_plan(queries["replay_notify" if notify else "replay"], params))


def replay_message(
    tx: Any,
    *,
    schema: str = DEFAULT_SCHEMA,
    message_id: int,
    budget: int = DEFAULT_WEBHOOK_MAX_ATTEMPTS,
    notify: bool = True,
) -> bool:
    """Send one delivered webhook message again, as :func:`replay` sends a
    window of them: back to the hot table with its id, key and body, ready now,
    ``budget`` attempts on top of those made. Return False if no delivered
    message has this id (it waits, is dead, or never was). Raises
    :class:`InvalidArgument` for a plain message (only webhooks are replayed;
    a plain message's key is its receiver's to dedupe, enqueue it again
    instead) and for an endpoint that is gone or disabled.
    """
    params = {"id": check_id(message_id, "message_id"), "budget": check_budget(budget)}
    return run_sync(tx, _replay_message_plan(schema, params, notify), schema=schema)


def _replay_message_plan(schema: str, params: dict[str, Any], notify: bool) -> Plan[bool]:
    queries = queries_for(schema)
    found = yield from rows_plan(queries["replay_message_endpoint"], params, _EndpointOf)
    if not found:
        return False
    endpoint_id = found[0].endpoint_id
    if found[0].expunged_at is not None:
        raise InvalidArgument(
            "message_id",
            f"message {params['id']} was expunged at "
            f"{found[0].expunged_at.isoformat(timespec='seconds')}: nothing to send",
        )
    if endpoint_id is None:
        raise InvalidArgument(
            "message_id", f"message {params['id']} is not a webhook: only webhooks are replayed"
        )
    yield from _enabled_endpoint_plan(schema, endpoint_id)
    statement = queries["replay_message_notify" if notify else "replay_message"]
    return (yield from scalar_plan(statement, params)) == 1


class _EndpointOf(NamedTuple):
    """The row of ``replay_message_endpoint``."""

    endpoint_id: int | None
    expunged_at: datetime | None


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
    id comes back, ``created`` False). The endpoint's subscriptions and filter
    are not consulted: the operator chose it. Raises :class:`InvalidArgument` for a
    missing or disabled endpoint, an event key with no record (never published,
    or published longer ago than the retention period), or an event whose
    messages were all purged. ``notify`` wakes listening dispatchers when ``tx``
    commits.
    """
    if not isinstance(event_key, str) or not event_key:
        raise InvalidArgument("event_key", "must be a non-empty string")
    if len(event_key) > MAX_KEY_LENGTH:
        raise InvalidArgument("event_key", f"is longer than {MAX_KEY_LENGTH} characters")
    params = {
        "event_key": check_text(event_key, "event_key", error=InvalidArgument),
        "endpoint_id": check_id(endpoint_id, "endpoint_id"),
        "budget": check_budget(budget),
    }
    return run_sync(tx, _replay_event_plan(schema, params, notify), schema=schema)


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
    if row.expunged_at is not None:
        raise InvalidArgument(
            "event_key",
            f"the event was expunged at {row.expunged_at.isoformat(timespec='seconds')}: "
            "its payload is gone, nothing to send",
        )
    if not row.payload or row.id is None:
        raise InvalidArgument(
            "event_key", "the event's messages were all purged or expunged: nothing to send"
        )
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
    return run_sync(tx, _test_event_plan(schema, params, notify), schema=schema)


def _test_event_plan(schema: str, params: dict[str, Any], notify: bool) -> Plan[int]:
    yield from _enabled_endpoint_plan(schema, params["endpoint_id"])
    statement = queries_for(schema)["test_event_notify" if notify else "test_event"]
    return (yield from scalar_plan(statement, params))


class _ReplayEventRow(NamedTuple):
    """The row of ``replay_event``."""

    recorded: bool
    expunged_at: datetime | None
    payload: bool
    id: int | None
    created: bool
    notified: None = None


class _ReplayEndpoint(NamedTuple):
    """The row of ``replay_endpoint``."""

    id: int
    enabled: bool
    disabled_reason: str | None
