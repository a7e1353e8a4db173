"""What a dispatcher tells the world: counters, events and metrics.

The events a dispatcher logs about its messages and its database are built here,
in the one place that also keeps :class:`Stats` (read by tests, the bench and the
demo) and the Prometheus instruments of :mod:`dispatchers.runtime.metrics` in step with
the log. The claim loop, the outcome writer and the maintenance services say what
happened and :class:`Reporter` counts, logs and measures it, and tells the
dispatcher's :class:`~dispatchers.runtime.watchdog.Watchdog` which operations the
database answered or failed, and which made progress. Left out: the
``claimed`` event, logged by the claim loop itself (per message, on the hot path,
only when the log level asks for it), and the waker's ``listen_error``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from prometheus_client import Counter

from dispatchers.delivery.health import Transition
from dispatchers.delivery.jobs import Job
from dispatchers.runtime.log import EventLog
from dispatchers.runtime.metrics import Metrics
from dispatchers.runtime.watchdog import Watchdog
from dispatchers.store.messages import Completion
from dispatchers.store.rows import HealthRow
from dispatchers.store.sqlstates import is_transient, is_unreachable


@dataclass
class Stats:
    """Counters of one dispatcher's life, for logs, tests and benchmarks."""

    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    blocked: int = 0
    lease_lost: int = 0
    rescued: int = 0
    claims: int = 0
    empty_claims: int = 0
    flushes: int = 0
    renewals: int = 0
    history_removed: int = 0
    #: delivered messages whose payloads a retention rule erased
    payloads_erased: int = 0
    db_errors: int = 0
    round_trips: int = 0


class Reporter:
    """Counts, logs and measures what one dispatcher does.

    :param log: where events go.
    :param stats: the counters to keep (new ones by default).
    :param metrics: the instruments to update (new ones by default).
    :param watchdog: told of answers, errors and progress (none by default).
    """

    def __init__(
        self,
        log: EventLog,
        *,
        stats: Stats | None = None,
        metrics: Metrics | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        self.log = log
        self.stats = stats if stats is not None else Stats()
        self.metrics = metrics if metrics is not None else Metrics()
        self.watchdog = watchdog
        # per destination refused by the SSRF guard: when its event was last
        # logged, and the messages held since (see destination_blocked)
        self._blocked: dict[str, tuple[float, int]] = {}
        # while the database is unreachable: when that began, and the errors since
        self._outage: tuple[float, int] | None = None
        # the deliveries counter of each outcome: labels() looks its child up anew
        self._deliveries: dict[str, Counter] = {}

    def answered(self, operation: str) -> None:
        """The database answered ``operation``; after it was unreachable, the
        first answer logs ``reconnected``, once for the outage."""
        if self.watchdog is not None:
            self.watchdog.answered(operation)
        self.metrics.database_answered()
        if self._outage is not None:
            began, errors = self._outage
            self._outage = None
            self.log.event(
                "reconnected",
                operation=operation,
                unreachable_s=round(time.monotonic() - began, 3),
                errors=errors,
            )

    def progressed(self) -> None:
        """The outbox's work moved on: claimed, recorded, rescued, or seen to change."""
        if self.watchdog is not None:
            self.watchdog.progressed()

    def started(self, **fields: object) -> None:
        """The dispatcher is ready: checked, connected, serving its metrics if
        asked, about to claim. ``fields`` say how it runs (schema, owner,
        concurrency, wake-ups, metrics URLs)."""
        self.log.event("started", **fields)

    # -- claims and outcome batches ------------------------------------------------------

    def claimed_batch(self, count: int) -> None:
        """A claim statement answered with ``count`` messages."""
        self.stats.claims += 1
        self.answered("claim")
        if count:
            self.progressed()
        else:
            self.stats.empty_claims += 1
        metrics = self.metrics
        metrics.claims.inc()
        metrics.claim_batch.observe(count)

    def flushed_batch(self, count: int) -> None:
        """A completion statement recorded a batch of ``count`` outcomes."""
        self.stats.flushes += 1
        self.answered("complete")
        self.progressed()
        self.metrics.flush_batch.observe(count)

    # -- messages ------------------------------------------------------------------------

    def outcome(self, c: Completion, job: Job | None, now: datetime) -> None:
        """``c`` was recorded; ``job`` is the claim it ends (None when that claim
        is no longer held here)."""
        metrics = self.metrics
        counter = self._deliveries.get(c.outcome)
        if counter is None:
            counter = self._deliveries[c.outcome] = metrics.deliveries.labels(c.outcome)
        counter.inc()
        if c.duration_ms is not None:
            metrics.attempt_seconds.observe(c.duration_ms / 1000)
        if c.state == "delivered" and job is not None:
            waited = (now - job.created_at).total_seconds()
            metrics.commit_to_delivery_seconds.observe(max(0.0, waited))
        log = self.log
        if c.outcome == "released":
            self.stats.released += 1
            log.event("released", message_id=c.id, attempt=c.attempt, sent=c.sent)
        elif c.outcome == "blocked":
            # held unsent; destination_blocked says so once per destination
            self.stats.blocked += 1
        elif c.state == "delivered":
            self.stats.delivered += 1
            if log.enabled("delivered"):
                log.event(
                    "delivered",
                    message_id=c.id,
                    attempt=c.attempt,
                    status=c.status,
                    ms=c.duration_ms,
                    host=_host(job),
                    **_trace(c),
                )
        elif c.state == "ready":
            self.stats.retried += 1
            log.event(
                "retried",
                message_id=c.id,
                attempt=c.attempt,
                status=c.status,
                error_class=c.error_class,
                delay_s=round(c.delay, 3),
                host=_host(job),
                **_trace(c),
            )
        else:
            self.stats.dead += 1
            log.event(
                "dead",
                message_id=c.id,
                attempt=c.attempt,
                status=c.status,
                error_class=c.error_class,
                error=c.error,
                host=_host(job),
                **_trace(c),
            )

    def lease_lost(self, message_id: int, attempt: int, reason: str) -> None:
        self.stats.lease_lost += 1
        self.metrics.lease_lost.inc()
        self.log.event("lease_lost", message_id=message_id, attempt=attempt, reason=reason)

    def outcome_dropped(self, c: Completion) -> None:
        self.log.event(
            "outcome_dropped",
            message_id=c.id,
            attempt=c.attempt,
            reason="the outcome could not be written; the lease will expire and the "
            "message will be delivered again",
        )

    def rescued(self, message_id: int, state: str) -> None:
        self.stats.rescued += 1
        self.progressed()
        self.log.event("rescued", message_id=message_id, state=state)

    def endpoint_disabled(self, endpoint_id: int, reason: str) -> None:
        self.log.event("endpoint_disabled", endpoint_id=endpoint_id, reason=reason)

    def probing(self, job: Job) -> None:
        """``job`` is the probe of its destination's open breaker."""
        self.metrics.health_transitions.labels(Transition.PROBING).inc()
        self.log.event(
            "breaker_probing", destination=job.destination, message_id=job.id, attempt=job.attempts
        )

    def health(self, transition: Transition, row: HealthRow) -> None:
        """A destination's breaker or hold changed as ``transition`` says; ``row``
        is its health row now (a closed breaker's as it was)."""
        self.metrics.health_transitions.labels(transition).inc()
        fields: dict[str, object] = {"destination": row.destination}
        if transition is not Transition.CLOSED:
            fields["blocked_until"] = row.blocked_until.isoformat()
        if transition is Transition.REOPENED:
            fields["failed_probes"] = row.failed_probes
        self.log.event(_HEALTH_EVENTS[transition], **fields)

    def drained(self, scheduled_later: int) -> None:
        """Nothing is due or running: a drain ends (``scheduled_later`` are not due yet)."""
        self.log.event("drained", scheduled_later=scheduled_later)

    # -- trouble -------------------------------------------------------------------------

    def db_error(self, operation: str, exc: BaseException, *, retry: int | None = None) -> None:
        """``operation`` failed in the database; ``retry`` numbers the failures of
        one write that is tried until it passes."""
        self.stats.db_errors += 1
        self.metrics.db_errors.labels(operation).inc()
        fields: dict[str, object] = {
            "operation": operation,
            "error_class": type(exc).__name__,
            "sqlstate": getattr(exc, "sqlstate", None),
            "transient": is_transient(exc),
        }
        if retry is not None:
            fields["retry"] = retry
        if is_unreachable(exc):
            # /healthz says so at once; the next answer ends the outage
            self.metrics.database_unreachable()
            began, errors = self._outage or (time.monotonic(), 0)
            self._outage = (began, errors + 1)
        self.log.event("db_error", **fields)
        if self.watchdog is not None:
            self.watchdog.failed(operation, exc)

    def failed(self, failure: BaseException) -> None:
        """The dispatcher stops on ``failure``, which waiting will not heal."""
        self.log.event("failed", error_class=type(failure).__name__, error=str(failure))

    def stopping(self, in_flight: int, grace: float) -> None:
        """Asked to stop, with ``in_flight`` deliveries that get ``grace`` seconds."""
        self.log.event(
            "stopping",
            in_flight=in_flight,
            grace_s=grace,
            hint="signal again to stop now; what is cut off is released and sent again",
        )

    def outcomes_unrecorded(self, count: int) -> None:
        """Shutting down, ``count`` outcomes could not be written in time."""
        self.log.event(
            "db_error",
            operation="shutdown_flush",
            error="outcomes not recorded before exit; their leases will expire and "
            "the messages will be delivered again",
            count=count,
        )

    def abandoned(self, operation: str, count: int, waited: float) -> None:
        """Shutting down, ``count`` calls of ``operation`` still under way after
        ``waited`` seconds are cancelled."""
        self.log.event(
            "shutdown_abandoned", operation=operation, count=count, waited_s=round(waited, 3)
        )

    def secrets_unavailable(self, job: Job, delay: float) -> None:
        """``job`` is held back unsent for ``delay`` seconds: its endpoint's secrets
        could not be opened."""
        self.log.event(
            "secrets_unavailable",
            message_id=job.id,
            endpoint_id=job.endpoint_id,
            error=job.secrets_unavailable,
            retry_in_s=delay,
        )

    def lag_changed(self, changed: str, *, oldest_s: float, threshold_s: float) -> None:
        """This dispatcher's report of the lag (``--lag-alert``) changed its state
        to ``changed`` (``exceeded`` or ``recovered``) and raised the alert."""
        self.log.event(f"lag_{changed}", oldest_due_s=round(oldest_s, 3), threshold_s=threshold_s)

    def destination_blocked(self, job: Job, error: str | None, delay: float) -> None:
        """``job`` is held unsent for ``delay`` seconds: the SSRF guard refused its
        destination (``error`` names the address and the options that allow it).
        Logged at once for a destination, then at most once per ``delay`` with
        the count of messages held meanwhile: a backlog to a refused destination
        is one line a minute, not one per message."""
        now = time.monotonic()
        last, held = self._blocked.get(job.destination, (None, 0))
        held += 1
        if last is not None and now - last < delay:
            self._blocked[job.destination] = (last, held)
            return
        if len(self._blocked) >= _BLOCKED_KEPT:  # forget the quiet ones
            self._blocked = {d: v for d, v in self._blocked.items() if now - v[0] < delay}
        self._blocked[job.destination] = (now, 0)
        self.log.event(
            "destination_blocked",
            destination=job.destination,
            host=_host(job),
            held=held,
            retry_in_s=delay,
            error=error,
            hint="no attempt is spent; restart the dispatcher with --allow-private-networks "
            "(or --allow-network CIDR) to deliver to it",
        )

    def internal_error(self, operation: str, exc: BaseException) -> None:
        self.log.event("internal_error", operation=operation, error_class=type(exc).__name__)


_BLOCKED_KEPT = 1024
"""Refused destinations :meth:`Reporter.destination_blocked` remembers before it
forgets those it has not logged within their interval."""

_HEALTH_EVENTS = {
    Transition.OPENED: "breaker_opened",
    Transition.PROBING: "breaker_probing",
    Transition.CLOSED: "breaker_closed",
    Transition.REOPENED: "breaker_reopened",
    Transition.HELD: "destination_held",
    Transition.PROBE_RETURNED: "breaker_probe_returned",
}
"""The event logged for each transition of a destination's health."""


def _host(job: Job | None) -> str | None:
    """The host a message went to, for logs (never the path or query)."""
    return urlsplit(job.url).hostname if job is not None else None


def _trace(c: Completion) -> dict[str, str]:
    """The ``trace_id`` field of an outcome's line: only when the attempt had one,
    so untraced deployments' lines stay as they were."""
    return {"trace_id": c.trace_id} if c.trace_id is not None else {}
