"""Inspection for operators: one message with its attempts, and the outbox's status.

Part of :mod:`outbox.admin`, which exports its public names.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from outbox._arguments import check_id
from outbox._queries import queries_for
from outbox._transaction import Plan, rows_plan, run_sync
from outbox.defaults import DEFAULT_SCHEMA
from outbox.destinations import DestinationStatus


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
    """A message from the hot table or (``state == "delivered"``) the history,
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


def _headers(value: object) -> dict[str, str]:
    if isinstance(value, str | bytes):  # drivers that do not decode jsonb
        value = json.loads(value)
    return dict(value) if isinstance(value, Mapping) else {}


def message_show(tx: Any, message_id: int, *, schema: str = DEFAULT_SCHEMA) -> MessageInfo | None:
    """The message (waiting, in flight, paused, dead, or delivered) with its
    attempts; None if no message has this id (never written, or purged)."""
    return run_sync(tx, _show_plan(schema, check_id(message_id, "message_id")), schema=schema)


def _show_plan(schema: str, message_id: int) -> Plan[MessageInfo | None]:
    queries = queries_for(schema)
    rows = yield from rows_plan(queries["message_get"], {"id": message_id}, _message_row)
    if not rows:
        return None
    attempts = yield from rows_plan(queries["message_attempts"], {"id": message_id}, AttemptInfo)
    return dataclasses.replace(rows[0], attempt_log=attempts)


def _message_row(*, headers: object, body: bytes | memoryview, **columns: Any) -> MessageInfo:
    """A row of ``message_get``, without its attempts (read next)."""
    return MessageInfo(headers=_headers(headers), body=bytes(body), attempt_log=[], **columns)


def status(tx: Any, *, schema: str = DEFAULT_SCHEMA) -> dict[str, Any]:
    """A snapshot of the outbox, as a JSON-friendly dict.

    - ``messages``: counts by state: ``ready`` (due now, and claimable),
      ``blocked`` (due, but an open breaker or a ``Retry-After`` hold keeps its
      destination's messages back), ``scheduled`` (due later), ``held_unsent``
      (of those, held unsent by a dispatcher: a destination its SSRF guard
      refused, signing secrets it could not open; their last error says
      which), ``running``
      (live lease), ``lease_expired`` (running past the lease: the dispatcher
      died or froze; the rescuer returns them), ``paused``, ``dead``;
    - ``oldest_ready_age_s``: seconds the oldest ready message has waited since it
      became due (None when nothing is ready), the dispatch lag; blocked messages
      wait for their destination, not for a dispatcher, and do not count;
    - ``last_5_minutes``: attempts started in the last five minutes that
      ``delivered`` or ``failed`` (retried, dead, or lost their lease);
    - ``endpoints``: per endpoint ``id``, ``url``, ``enabled``,
      ``disabled_reason``, ``failure_streak``, ``pending`` (ready, running or
      paused messages), ``dead``, ``last_success_at``;
    - ``destination_health``: per destination whose circuit breaker is open or probing,
      or that a ``Retry-After`` holds: ``destination``, ``state`` (``open``,
      ``probing``, ``held``), ``blocked_until`` (no claim takes its messages
      before; an open breaker's probe goes out then), ``failed_probes`` (in a
      row), ``opened_at``, ``reason`` (the answer that opened or held it);
    - ``secrets``: signing secrets, endpoints' client keys and credentials
      ``plain_text`` (stored unsealed: whoever reads the table can forge
      deliveries, or pose as the dispatcher) and ``sealed`` (a count per key id, see
      :mod:`outbox.sealing`);
    - ``destinations``: per destination with a policy (an origin, or
      ``endpoint:<id>`` for an endpoint with a cap or a rate limit) its
      ``max_concurrency``, ``rate_limit_per_s``, ``burst``, and its messages
      ``ready`` (due now) and ``running``;
    - ``now``: the database's clock.
    """
    return run_sync(tx, _status_plan(schema), schema=schema)


def _status_plan(schema: str) -> Plan[dict[str, Any]]:
    queries = queries_for(schema)
    counts = yield from rows_plan(queries["status_counts"], {}, _StatusCounts)
    c = counts[0]
    endpoints = yield from rows_plan(queries["status_endpoints"], {}, _EndpointStatus)
    health = yield from rows_plan(queries["status_destination_health"], {}, DestinationHealth)
    secrets = yield from rows_plan(queries["status_secrets"], {}, _SecretsByKey)
    policed = yield from rows_plan(queries["status_destinations"], {}, DestinationStatus)
    sealed = {s.key_id: s.secrets for s in secrets if s.key_id is not None}
    return {
        "messages": {
            "ready": c.ready,
            "blocked": c.blocked,
            "scheduled": c.scheduled,
            "held_unsent": c.held_unsent,
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
        "destinations": [d._asdict() for d in policed],
        "destination_health": [d._asdict() for d in health],
        "secrets": {
            "plain_text": sum(s.secrets for s in secrets) - sum(sealed.values()),
            "sealed": sealed,
        },
        "now": c.now,
    }


class _StatusCounts(NamedTuple):
    """The row of ``status_counts``: messages by state, lag, recent attempts."""

    ready: int
    blocked: int
    scheduled: int
    held_unsent: int
    running: int
    lease_expired: int
    paused: int
    dead: int
    oldest_ready_age_s: float | None
    delivered: int
    failed: int
    now: datetime


class _SecretsByKey(NamedTuple):
    """A row of ``status_secrets``: how many signing secrets and client keys a key
    seals (None: plain text)."""

    key_id: str | None
    secrets: int


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


class DestinationHealth(NamedTuple):
    """A row of ``status_destination_health`` (and of the dashboard's
    ``ui_destination_health``): an open breaker or a hold."""

    destination: str
    state: str
    blocked_until: datetime
    failed_probes: int
    opened_at: datetime | None
    reason: str | None
