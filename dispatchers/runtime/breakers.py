"""The dispatcher's side of destination health: circuit breakers and holds.

:class:`Breakers` notes each attempt's outcome in a
:class:`~dispatchers.delivery.health.HealthBook` and writes the transitions it
calls for (a Retry-After hold, a breaker opened, probed, closed or reopened) to the
shared ``destination_health`` row that every claim reads. A transition is written
once, by the dispatcher that saw it; a failed write is reported, not retried.

Design: docs/explanation/design/destination-health.md
"""

from __future__ import annotations

from dispatchers.delivery.health import HealthBook, Transition, hold_for, is_counted, is_failure
from dispatchers.delivery.jobs import Job
from dispatchers.delivery.outcome import Outcome
from dispatchers.delivery.retry import DEFAULT_MAX_RETRY_AFTER
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.protocol import DispatchStore
from dispatchers.store.rows import HealthRow

__all__ = ["Breakers"]


class Breakers:
    """Writes the health transitions of the destinations one dispatcher sends to.

    :param store: the dispatcher's statements.
    :param report: told of every transition written.
    :param owner: the lease owner: a probe's outcome is fenced by it.
    :param config: the ``breaker_*`` settings and the retry policies (whose
        ``max_retry_after``, where they have one, bounds a hold).
    """

    def __init__(
        self, store: DispatchStore, report: Reporter, *, owner: str, config: DispatcherConfig
    ) -> None:
        self.store = store
        self.report = report
        self.owner = owner
        self.config = config
        self.book = HealthBook(config.breaker)
        self.holds = config.retry_after_holds

    async def attempted(self, job: Job, outcome: Outcome) -> None:
        """Note ``outcome`` of an attempt of ``job``, and write what it calls for."""
        destination = job.destination
        hold = hold_for(outcome, self._max_retry_after(job)) if self.holds else None
        if job.probe:
            await self._probed(destination, outcome, hold)
            return
        if hold is not None and self.book.hold(destination, hold):
            await self._write(
                Transition.HELD,
                "health_hold",
                destination=destination,
                hold_s=hold,
                reason=outcome.error,
            )
        if self.book.note(destination, outcome):
            await self._write(
                Transition.OPENED,
                "health_open",
                destination=destination,
                backoff_s=self.config.breaker_backoff,
                reason=outcome.error,
            )

    async def _probed(self, destination: str, outcome: Outcome, hold: float | None) -> None:
        """The probe's outcome closes the breaker, or opens it again for longer; a
        probe that never reached the destination gives its turn back."""
        if not is_counted(outcome):
            await self._write(Transition.PROBE_RETURNED, "health_unprobe", destination=destination)
            return
        if not is_failure(outcome):
            if await self._write(Transition.CLOSED, "health_close", destination=destination):
                self.book.forget(destination)
            return
        config = self.config
        await self._write(
            Transition.REOPENED,
            "health_reopen",
            destination=destination,
            backoff_s=config.breaker_backoff,
            backoff_max_s=config.breaker_backoff_max,
            hold_s=hold or 0.0,
        )

    async def _write(self, transition: Transition, statement: str, **params: object) -> bool:
        """Run ``statement``; report ``transition`` if it changed the row."""
        try:
            row: HealthRow | None = await self.store.health(statement, owner=self.owner, **params)
        except Exception as exc:
            self.report.db_error(statement, exc)
            return False
        self.report.answered(statement)
        if row is None:
            return False
        self.report.health(transition, row)
        return True

    def _max_retry_after(self, job: Job) -> float:
        config = self.config
        policy = config.webhook_retry_policy if job.endpoint_id is not None else config.retry_policy
        return float(getattr(policy, "max_retry_after", DEFAULT_MAX_RETRY_AFTER))
