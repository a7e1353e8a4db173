"""The duties a dispatcher runs beside its claims, as small services.

:class:`Heartbeat`, :class:`Rescuer`, :class:`Partitions`, :class:`Retention` and
:class:`BacklogGauge`. Each takes its settings as arguments, does one round in
``run_once()`` (which tests call and which raises what the database raised) and
repeats it every ``interval`` in ``run()``; after a failed round it retries after
the shared backoff, never later than the interval.

Design: docs/explanation/design/maintenance.md
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import ClassVar

from dispatchers.runtime.alerts import LagWatch
from dispatchers.runtime.backoff import Backoff
from dispatchers.runtime.flights import Flights, Lease
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.protocol import DispatchStore
from dispatchers.store.rows import Partition

__all__ = [
    "BacklogGauge",
    "Heartbeat",
    "Partitions",
    "Rescuer",
    "Retention",
    "Service",
    "expired",
    "floors",
]


class Service(ABC):
    """One maintenance duty, run every ``interval`` seconds.

    Subclasses name the ``operation`` their database errors are reported under,
    say whether the first round waits an ``interval`` (``wait_first``), and
    implement :meth:`run_once`.
    """

    operation: ClassVar[str]
    wait_first: ClassVar[bool] = True

    def __init__(self, store: DispatchStore, report: Reporter, *, interval: float) -> None:
        self.store = store
        self.report = report
        self.interval = interval

    @abstractmethod
    async def run_once(self) -> object:
        """Do one round of the duty."""

    async def run(self) -> None:
        """Run a round every ``interval`` until cancelled; never stop on an error."""
        backoff = Backoff()
        pause = self.interval if self.wait_first else 0.0
        while True:
            if pause:
                await asyncio.sleep(pause)
            try:
                await self.run_once()
            except Exception as exc:
                self.report.db_error(self.operation, exc)
                pause = min(self.interval, backoff.next())
            else:
                backoff.reset()
                pause = self.interval


class Heartbeat(Service):
    """Renews the leases of ``owner`` in one statement per round.

    :param flights: what the dispatcher holds: the leases to renew, read under
        ``flights.lock``, which the outcome writer holds too, so that a renewal
        never sees a lease whose outcome was just recorded (a row that has left
        the table) and takes it for lost.
    :param lost: called with each lease the renewal did not find (another
        dispatcher took the message over, or its lease expired and it was
        rescued): the caller stops its delivery.
    """

    operation = "renew"

    def __init__(
        self,
        store: DispatchStore,
        report: Reporter,
        *,
        owner: str,
        interval: float,
        flights: Flights,
        lost: Callable[[int, int], None],
    ) -> None:
        super().__init__(store, report, interval=interval)
        self.owner = owner
        self._flights = flights
        self._lost = lost

    async def run_once(self) -> list[Lease]:
        """Renew every lease held; return (and hand to ``lost``) those that are gone."""
        async with self._flights.lock:
            held = self._flights.leases()
            if not held:
                return []
            alive = await self.store.renew(self.owner, held)
            self.report.answered(self.operation)
            self.report.stats.renewals += 1
        gone = [lease for lease in held if lease[0] not in alive]
        for message_id, attempt in gone:
            self._lost(message_id, attempt)
        return gone


class Rescuer(Service):
    """Returns expired leases to ``ready`` (or ``dead``), by the lease-expiry index.

    The first round runs at once: a dispatcher restarted after a crash hands on
    what its previous life held without waiting an interval.

    :param rescued: called after a round that rescued something (the claim loop
        may have work now).
    """

    operation = "rescue"
    wait_first = False

    def __init__(
        self,
        store: DispatchStore,
        report: Reporter,
        *,
        interval: float,
        rescued: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(store, report, interval=interval)
        self._rescued = rescued

    async def run_once(self) -> list[tuple[int, str]]:
        """Rescue every expired lease; return each message id with its new state."""
        rescued = await self.store.rescue()
        self.report.answered(self.operation)
        for message_id, state in rescued:
            self.report.rescued(message_id, state)
        if rescued:
            self._rescued()
        return rescued


EXTEND_BATCH = 4
"""Partitions made per statement by :class:`Partitions` (each costs some 30 ms of
catalog work under the parent table's lock, which completions wait for)."""


def floors(partitions: Sequence[Partition]) -> dict[str, datetime | None]:
    """Per table (delivered, attempts), the lower bound of its oldest partition of
    a range: below it are only the legacy partition (bounded by MINVALUE) and
    the default one, whose rows :class:`Retention` removes one by one. None for
    a table with no such partition (then every row is theirs)."""
    found: dict[str, datetime | None] = {"delivered": None, "attempts": None}
    for p in partitions:
        if p.lower is not None:
            current = found.get(p.parent)
            found[p.parent] = p.lower if current is None else min(current, p.lower)
    return found


def expired(partitions: Sequence[Partition], now: datetime, retention: float) -> list[Partition]:
    """The partitions whose whole range ended at least ``retention`` seconds before
    ``now`` (never the default one), delivered's first, each table's oldest first."""
    horizon = now - timedelta(seconds=retention)
    old = [p for p in partitions if p.upper is not None and p.upper <= horizon]
    return sorted(old, key=lambda p: (p.parent != "delivered", p.upper))


class Partitions(Service):
    """Keeps the history (delivered, attempts) partitioned by time (migration 0032)
    and the idempotency keys and event records in generations (migration 0033).

    A round makes the partitions missing up to ``ahead`` seconds from now, each
    ``step`` long (hour, day or week), and drops each partition whose whole range
    ended before the retention period: delivered messages and attempts are kept
    at least the retention period, and at most one ``step`` more. Then it turns
    the generation of keys and event records when it is due (the previous
    tables dropped whole, the current ones made previous) and carries the keys
    of the messages still in the outbox into the new generation, ``batch``
    messages per statement: a key is kept at least the retention period after
    its message left the outbox, an event's record at least the retention
    period after it was published, and both at most about twice that.

    Every dispatcher runs it; the database makes it safe: one at a time makes
    partitions or turns and carries the generation (the others skip), and a
    drop of a partition already dropped returns false. A round carries at most
    ``batches`` batches, pausing ``pause`` seconds between two, as
    :class:`Retention` does; the carry goes on at the next round. Making or
    dropping a partition, and turning the generation, wait for their locks a
    moment only (:data:`~dispatchers.store.postgres.DDL_LOCK_TIMEOUT`); one that
    cannot have them fails the round, which is tried again after the backoff,
    so a long reader never holds completions or producers up behind it.

    The first round runs at once: a dispatcher that was stopped for days makes
    the partitions it missed before anything else.
    """

    operation = "partitions"
    wait_first = False

    def __init__(
        self,
        store: DispatchStore,
        report: Reporter,
        *,
        interval: float,
        retention: float,
        ahead: float,
        step: str,
        batch: int,
        batches: int = 20,
        pause: float = 0.1,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__(store, report, interval=interval)
        self.retention = retention
        self.ahead = ahead
        self.step = step
        self.batch = batch
        self.batches = batches
        self.pause = pause
        self._clock = clock

    async def run_once(self) -> list[str]:
        """Make the partitions ahead, drop the expired ones, and turn and carry the
        generation of keys; return the names of the partitions dropped."""
        # a few partitions per statement, each statement its own transaction: the
        # parent's lock is held for one batch of catalog work at a time
        while len(await self.store.extend_history(self.ahead, self.step, EXTEND_BATCH)) == (
            EXTEND_BATCH
        ):
            pass
        partitions = await self.store.history_partitions()
        dropped = []
        for partition in expired(partitions, self._clock(), self.retention):
            if await self.store.drop_partition(partition.partition):
                dropped.append(partition.partition)
        await self.store.turn_keys()
        for i in range(self.batches):
            if i:
                await asyncio.sleep(self.pause)
            carried = await self.store.carry_keys(self.batch)
            if carried is None or carried < self.batch:
                break
        # once per round, when every statement of it was answered: an error that
        # one of them meets at every round counts as the round's (the watchdog
        # stops a dispatcher whose operation fails for good for a lease)
        self.report.answered(self.operation)
        return dropped


class Retention(Service):
    """Removes history past the retention period that is not dropped a partition
    at a time, ``batch`` rows per statement: the rows below the oldest partition
    of a range (see :func:`floors`: the legacy partition, the table before it was
    partitioned, and the default partition), with their attempts (idempotency
    keys and event records go a generation at a time, :class:`Partitions`);
    then erases the payloads that the retention rules
    (:mod:`outbox.retention_rules`) keep for less, ``batch`` messages per rule
    and statement.

    A round removes up to ``batches`` batches, pausing ``pause`` seconds between
    two full ones so that claims and outcome writes get in between: no statement
    holds locks for long, and a large backlog drains over a few rounds.
    """

    operation = "retention"

    def __init__(
        self,
        store: DispatchStore,
        report: Reporter,
        *,
        interval: float,
        batch: int,
        batches: int = 20,
        pause: float = 0.1,
    ) -> None:
        super().__init__(store, report, interval=interval)
        self.batch = batch
        self.batches = batches
        self.pause = pause

    async def run_once(self) -> int:
        """Remove expired history until none is left or the round is over; return
        how many rows went."""
        # not reported as answered alone: a batch that keeps failing must count as
        # the round's error for as long as it does (the watchdog's rule)
        below = floors(await self.store.history_partitions())
        total = 0
        for i in range(self.batches):
            if i:
                await asyncio.sleep(self.pause)
            removed = await self.store.remove_history(
                self.batch,
                delivered_floor=below["delivered"],
                attempts_floor=below["attempts"],
            )
            self.report.answered(self.operation)
            self.report.stats.history_removed += removed.history
            total += removed.history
            if removed.history < self.batch:
                break
        for i in range(self.batches):
            if i:
                await asyncio.sleep(self.pause)
            erased = await self.store.expire_payloads(self.batch)
            self.report.answered(self.operation)
            self.report.stats.payloads_erased += sum(e.erased for e in erased)
            if all(e.erased < self.batch for e in erased):
                break
        return total


class BacklogGauge(Service):
    """Reads the backlog (the ready messages due now, per destination, and how
    long the oldest has waited) into the ``/metrics`` gauges, for the ``top``
    destinations with the most and the rest as one. Every dispatcher reads the
    same figures: take the max across processes, not the sum. With ``lag``, each
    read is reported to it too, which raises the lag's alerts.

    The first round runs at once, so that a scrape soon after start finds it.
    """

    operation = "backlog"
    wait_first = False

    def __init__(
        self,
        store: DispatchStore,
        report: Reporter,
        *,
        interval: float,
        top: int,
        lag: LagWatch | None = None,
    ) -> None:
        super().__init__(store, report, interval=interval)
        self.top = top
        self.lag = lag

    async def run_once(self) -> int:
        """Read the backlog, set the gauges and report the lag; return the
        messages due in all."""
        rows = await self.store.backlog(self.top)
        self.report.answered(self.operation)
        self.report.metrics.backlog([(r.destination, r.ready, r.oldest_s) for r in rows])
        if self.lag is not None:
            await self.lag.observed(rows)
            self.report.answered(self.operation)
        return sum(r.ready for r in rows)
