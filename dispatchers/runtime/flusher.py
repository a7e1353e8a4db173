"""Outcome batching: a buffer that writes on size or on time, and the write.

A :class:`Flusher` writes outcomes in one statement per batch once ``size`` wait
or ``interval`` after the first, through :meth:`OutcomeWriter.write` (fenced by
owner and attempt). Items are keyed by message id: a newer one replaces the one
waiting, and an item leaves the buffer only after a write that returned.

Design: docs/explanation/design/flusher.md
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from itertools import islice
from typing import Generic, TypeVar

from dispatchers.runtime.backoff import Backoff
from dispatchers.runtime.flights import Flights
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.messages import Completion
from dispatchers.store.protocol import DispatchStore
from dispatchers.store.sqlstates import is_transient

__all__ = ["Flusher", "OutcomeWriter"]

T = TypeVar("T")

ERROR_PAUSE = 1.0
"""Seconds the flusher waits after its write callback raised, before it tries
again (the callback retries database errors itself; this is for the others)."""


class Flusher(Generic[T]):
    """Holds items by key and hands them to ``write`` in batches.

    :param write: writes one batch (at most ``batch`` items); an item leaves the
        buffer once the call returns.
    :param size: this many items waiting start a write at once.
    :param interval: otherwise the first item waits at most this long.
    :param batch: the most items handed to one ``write`` call.
    :param on_error: told about an exception ``write`` raised (the items stay,
        and are written again after :data:`ERROR_PAUSE`).
    """

    def __init__(
        self,
        write: Callable[[list[T]], Awaitable[None]],
        *,
        size: int,
        interval: float,
        batch: int,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self._write = write
        self.size = size
        self.interval = interval
        self.batch = batch
        self._on_error = on_error
        self._items: dict[int, T] = {}
        self._waiting = asyncio.Event()  # something is held
        self._due = asyncio.Event()  # write without waiting for the interval
        self._lock = asyncio.Lock()  # one write at a time, in order

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[int]:
        """The keys held, oldest first."""
        return iter(self._items)

    def add(self, key: int, item: T) -> None:
        """Hold ``item`` until it is written (replacing one held for ``key``)."""
        self._items[key] = item
        self._waiting.set()
        if len(self._items) >= self.size:
            self._due.set()

    def discard(self, key: int, item: T | None = None) -> None:
        """Stop holding what ``key`` has (only if it is ``item``, when given)."""
        if item is None:
            self._items.pop(key, None)
        elif self._items.get(key) is item:
            del self._items[key]

    def flush_soon(self) -> None:
        """Write what is held without waiting for the interval."""
        self._due.set()

    async def flush(self) -> None:
        """Write everything held now, in batches, until nothing is left."""
        async with self._lock:
            items = self._items
            while items:
                keys = list(islice(items, self.batch))
                batch = [items[key] for key in keys]
                await self._write(batch)
                for key, item in zip(keys, batch, strict=True):
                    if items.get(key) is item:  # not replaced meanwhile
                        del items[key]

    async def run(self) -> None:
        """Write batches as they become due, until cancelled."""
        waiting, due = self._waiting, self._due
        while True:
            await waiting.wait()
            if not due.is_set():
                # Let a batch gather: fewer, larger statements.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval):
                        await due.wait()
            waiting.clear()
            due.clear()
            try:
                await self.flush()
            except Exception as exc:  # never let the flusher die: the items stay held
                self._on_error(exc)
                await asyncio.sleep(ERROR_PAUSE)
                waiting.set()


class OutcomeWriter:
    """Records batches of outcomes of one lease owner's claims.

    Each outcome is applied only while the claim it ends still holds the lease
    (owner and attempt match): an outcome of a lost lease changes nothing, and is
    reported as a lost lease.

    :param flights: what the dispatcher holds: each outcome written settles its
        claim there (unless that claim is no longer held), under ``flights.lock``,
        which the heartbeat holds too, so that it never renews while an outcome
        is recorded and its claim not yet settled.
    :param written: called after each batch written, with whether it finished a
        message that has an ordering key (the next one of that key may be due).
    :param dropped: called with an outcome that could not be written at all.
    """

    def __init__(
        self,
        store: DispatchStore,
        report: Reporter,
        *,
        owner: str,
        flights: Flights,
        written: Callable[[bool], None],
        dropped: Callable[[Completion], None],
    ) -> None:
        self.store = store
        self.report = report
        self.owner = owner
        self._flights = flights
        self._written = written
        self._dropped = dropped

    async def write(self, batch: list[Completion]) -> None:
        """Record ``batch``, trying transient errors again until they pass.

        Another error is a bug, or one outcome the database refuses: the batch is
        then written one by one, and an outcome that still cannot be written is
        dropped and its lease no longer renewed, so the rescuer hands the message
        on (it is delivered again, never lost) instead of one bad row blocking
        every outcome behind it.
        """
        backoff: Backoff | None = None  # made on the first error only
        tries = 0
        while True:
            tries += 1
            try:
                await self._try(batch, retried=tries > 1)
            except Exception as exc:
                if not is_transient(exc):
                    self.report.db_error("complete", exc)
                    break
                self.report.db_error("complete", exc, retry=tries)
            else:
                return
            backoff = backoff or Backoff()
            await asyncio.sleep(backoff.next())
        if len(batch) > 1:
            for completion in batch:
                await self.write([completion])
        else:
            self._dropped(batch[0])
            self.report.outcome_dropped(batch[0])

    async def _try(self, batch: list[Completion], *, retried: bool) -> None:
        """One try at writing ``batch``; then settle the claims it ends."""
        store = self.store
        report = self.report
        async with self._flights.lock:
            applied, disabled = await store.complete(self.owner, batch)
            if retried and len(applied) < len(batch):
                # An earlier try may have committed with its answer lost: what
                # it recorded is fenced out now, yet recorded, not lost.
                unapplied = [c for c in batch if c.id not in applied]
                applied |= await store.recorded(self.owner, unapplied)
            report.flushed_batch(len(batch))
            for endpoint_id, reason in disabled.items():
                report.endpoint_disabled(endpoint_id, reason)
            # Settle the books before the heartbeat can look at them again.
            now = datetime.now(UTC)
            unblocked = False  # a message with an ordering key is done with
            for completion in batch:
                job = self._flights.settle(completion.id, completion.attempt)
                if completion.id in applied:
                    report.outcome(completion, job, now)
                    unblocked |= job is not None and job.ordering_key is not None
                elif job is not None:  # a claim gone already was reported as lost
                    report.lease_lost(completion.id, completion.attempt, "outcome fenced out")
        self._written(unblocked)
