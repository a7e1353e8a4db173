"""The storage boundary of the runtime: every statement a dispatcher runs, as
typed calls.

:class:`~dispatchers.store.postgres.Store` runs them on PostgreSQL; the runtime
(the claim loop, the outcome writer, the maintenance services, the breakers)
knows only this protocol, so its tests can give it a store in memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from dispatchers.store.messages import ClaimResult, Completion
from dispatchers.store.rows import Backlog, Erased, HealthRow, Partition, Removed

Busy = Mapping[str, int] | None
"""Requests in flight per destination, for a claim (None: none)."""


class DispatchStore(Protocol):
    """What a dispatcher asks of its database. Each call is one short transaction
    (one round trip); none holds a lock past its return."""

    @property
    def round_trips(self) -> int:
        """Statements sent so far."""
        ...

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def claim(
        self, owner: str, limit: int, busy: Busy = None, alone: str | None = None
    ) -> ClaimResult:
        """Lease up to ``limit`` due messages to ``owner``, shared fairly across
        their destinations within the bound per destination (``busy`` counts the
        requests already in flight; ``alone`` names the destination the last
        claim found alone with ready messages)."""
        ...

    async def renew(self, owner: str, held: Sequence[tuple[int, int]]) -> set[int]:
        """Extend the leases ``held`` (id, attempt); return the ids still held."""
        ...

    async def complete(
        self, owner: str, batch: Sequence[Completion]
    ) -> tuple[set[int], dict[int, str]]:
        """Record ``batch``, each outcome fenced by owner and attempt; return the
        ids applied and the endpoints now disabled (id: reason)."""
        ...

    async def recorded(self, owner: str, batch: Sequence[Completion]) -> set[int]:
        """The ids of ``batch`` whose sent outcome ``owner`` recorded already."""
        ...

    async def rescue(self, limit: int = 1000) -> list[tuple[int, str]]:
        """Hand expired leases on; return (id, new state) pairs."""
        ...

    async def remove_history(
        self,
        limit: int,
        *,
        delivered_floor: datetime | None = None,
        attempts_floor: datetime | None = None,
    ) -> Removed:
        """Delete one batch of history past the retention period, below the floors."""
        ...

    async def history_partitions(self) -> list[Partition]:
        """The partitions of delivered and attempts, oldest first."""
        ...

    async def extend_history(self, ahead: float, step: str, most: int = ...) -> list[str]:
        """Make the partitions missing up to ``ahead`` seconds ahead; return them."""
        ...

    async def turn_keys(self) -> int | None:
        """Turn the generation of keys and event records if due; the new one, or None."""
        ...

    async def carry_keys(self, limit: int) -> int | None:
        """Carry one batch of live messages' keys into the current generation."""
        ...

    async def drop_partition(self, partition: str) -> bool:
        """Drop a partition past the retention period; whether it was."""
        ...

    async def expire_payloads(self, limit: int) -> list[Erased]:
        """Erase one batch per retention rule of payloads past its period."""
        ...

    async def work_remaining(self) -> tuple[int, int, int]:
        """(due now, running, scheduled later) across all dispatchers."""
        ...

    async def backlog(self, top: int, cap: int = ...) -> list[Backlog]:
        """The ready messages due now per destination (the ``top`` with the
        most; the rest summed under destination None)."""
        ...

    async def health(self, statement: str, **params: Any) -> HealthRow | None:
        """Run one transition of a destination's breaker or hold; return the row
        it changed, or None."""
        ...

    async def alert_lag(
        self, oldest_s: float, threshold_s: float, destination: str | None
    ) -> str | None:
        """Tell the database how long the oldest message due has waited: it raises
        ``outbox.lag.exceeded`` or ``outbox.lag.recovered`` once per crossing of
        ``threshold_s`` (returning ``exceeded`` or ``recovered``), else None."""
        ...

    async def alert_unknown_key(
        self, key_id: str, endpoint_id: int | None, dispatcher: str
    ) -> list[int]:
        """Raise ``outbox.secrets.unknown_key`` for ``key_id`` (once per key and
        hour); return the alert's messages (none when raised before)."""
        ...
