"""The messages one dispatcher holds: its in-flight bookkeeping.

A message is *held* from its claim until its outcome is written (or its lease is
lost); while held, its lease is renewed. A held message is *sending* while its
request runs. :class:`Flights` keeps both, the requests in flight per
destination (what a claim's bound per destination counts), and what the last
claim learned of its destinations (one alone, or several). It decides nothing
about time and does no I/O: the claim loop, the outcome writer and the
heartbeat read and change it through the methods below, one at a time on one
event loop; :attr:`Flights.lock` keeps an outcome write and a renewal apart
(a renewal must never see a lease whose outcome was just recorded and take it
for lost).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from dispatchers.delivery.jobs import Job

Lease = tuple[int, int]
"""A held message's id and the attempt number that fences its claim."""


@dataclass(eq=False)
class Flight:
    """One held message: its job, and the task sending it (None: not sent)."""

    job: Job
    task: asyncio.Task[None] | None = None


class Flights:
    """The messages held, and the requests in flight, of one dispatcher.

    :param per_destination: the bound on requests in flight to one destination.
    """

    def __init__(self, per_destination: int) -> None:
        self.per_destination = per_destination
        self.lock = asyncio.Lock()
        self._held: dict[int, Flight] = {}
        self.sending = 0
        """Requests in flight (held messages whose request is not finished)."""
        self._sending_to: collections.Counter[str] = collections.Counter()
        self.at_bound = 0
        """Destinations with ``per_destination`` requests in flight."""
        self.crowded = False
        """Whether the last claim that took messages met more than one destination
        (among its messages and those at their bound): the bound is what leaves
        room for the others then."""
        self.alone: str | None = None
        """The destination the last claim that took messages found alone: it may
        take every slot, and the next claim is told which one it was."""

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Flight]:
        return iter(list(self._held.values()))

    def get(self, message_id: int) -> Flight | None:
        return self._held.get(message_id)

    @property
    def sending_to(self) -> Mapping[str, int]:
        """Requests in flight per destination (only those with one or more)."""
        return self._sending_to

    # -- claims -------------------------------------------------------------------

    def claimed(self, jobs: Iterable[Job]) -> None:
        """Note the destinations a claim that took ``jobs`` met, with those at
        their bound: more than one, and a claim leaves room under the bound to
        each; one alone with ready messages and below its bound gets the whole
        batch."""
        met = {job.destination for job in jobs}
        if not met:
            return
        if self.at_bound:
            met.update(d for d, n in self._sending_to.items() if n >= self.per_destination)
        self.crowded = len(met) > 1
        self.alone = None if self.crowded else met.pop()

    def hold(self, job: Job) -> Flight:
        """Hold ``job`` (in place of any older attempt of the same message: see
        :meth:`drop`); return its flight."""
        flight = self._held[job.id] = Flight(job)
        return flight

    def sending_started(self, job: Job) -> None:
        """Count the request of held ``job`` as in flight."""
        self.sending += 1
        self._sending_to[job.destination] += 1
        if self._sending_to[job.destination] == self.per_destination:
            self.at_bound += 1

    def sending_ended(self, destination: str) -> bool:
        """Count a request to ``destination`` as finished; return whether that
        destination was at its bound (a claim may have passed its due messages
        over for want of room there)."""
        self.sending -= 1
        sending = self._sending_to[destination]
        if sending > 1:
            self._sending_to[destination] = sending - 1
        else:  # only the destinations with requests in flight go with a claim
            del self._sending_to[destination]
        if sending == self.per_destination:
            self.at_bound -= 1
            return True
        return False

    # -- outcomes and leases --------------------------------------------------------

    def settle(self, message_id: int, attempt: int) -> Job | None:
        """Stop holding the claim ``(message_id, attempt)`` and return its job; a
        newer claim of the same message (another attempt) is left held."""
        flight = self._held.get(message_id)
        if flight is None or flight.job.attempts != attempt:
            return None
        del self._held[message_id]
        return flight.job

    def drop(self, message_id: int) -> Flight | None:
        """Stop holding ``message_id`` whatever its attempt (its lease is lost, or
        it was claimed again while an older attempt was held); return its flight,
        if it was held."""
        return self._held.pop(message_id, None)

    def leases(self) -> list[Lease]:
        """The leases held now, to renew."""
        return [(mid, f.job.attempts) for mid, f in self._held.items()]

    def running(self) -> list[asyncio.Task[None]]:
        """The sending tasks not yet done."""
        return [f.task for f in self._held.values() if f.task is not None and not f.task.done()]
