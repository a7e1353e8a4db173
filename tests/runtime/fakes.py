"""Stand-ins for the runtime's two outside worlds: a store in memory and an HTTP
client that answers as told. Pure Python, no database, no network: the runtime's
own logic (claiming, capacity, leases, outcomes, shutdown) under test alone.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatchers.store.messages import Claimed, ClaimResult, Completion
from dispatchers.store.protocol import Busy
from dispatchers.store.rows import Backlog, Erased, HealthRow, Partition, Removed


@dataclass
class Row:
    """One message as the fake store keeps it."""

    id: int
    url: str
    destination: str
    state: str = "ready"  # ready | running | delivered | dead
    attempts: int = 0
    max_attempts: int = 3
    owner: str | None = None
    outcomes: list[Completion] = field(default_factory=list)


class FakeStore:
    """A :class:`~dispatchers.store.protocol.DispatchStore` in memory.

    Claims take ready messages in id order, at most ``per_destination`` in flight
    to a destination (``busy`` included), and lease them to the owner with the
    next attempt number; outcomes and renewals are fenced by owner and attempt,
    as the real statements fence them. :meth:`steal` makes another owner take a
    message over (the lease lost); ``failures`` raises on the next calls of an
    operation.
    """

    def __init__(self, *, per_destination: int = 100) -> None:
        self.per_destination = per_destination
        self.rows: dict[int, Row] = {}
        self.round_trips = 0
        self.opened = False
        self.closed = False
        self.claims: list[int] = []  # how many each claim took
        self.failures: dict[str, list[BaseException]] = {}
        self.claimed_event = asyncio.Event()
        self.lag_reports: list[tuple[float, float, str | None]] = []
        self.key_alerts: list[tuple[str, int | None]] = []

    def add(self, message_id: int, *, destination: str = "http://127.0.0.1:9") -> None:
        self.rows[message_id] = Row(message_id, f"{destination}/hook", destination)

    def steal(self, message_id: int) -> None:
        """Another dispatcher takes the message over: this owner's lease is gone."""
        row = self.rows[message_id]
        row.owner, row.attempts = "thief", row.attempts + 1

    def _call(self, operation: str) -> None:
        self.round_trips += 1
        pending = self.failures.get(operation)
        if pending:
            raise pending.pop(0)

    async def open(self) -> None:
        self.opened = True

    async def close(self) -> None:
        self.closed = True

    async def claim(
        self, owner: str, limit: int, busy: Busy = None, alone: str | None = None
    ) -> ClaimResult:
        self._call("claim")
        in_flight = dict(busy or {})
        taken: list[Claimed] = []
        for row in sorted(self.rows.values(), key=lambda r: r.id):
            if len(taken) >= limit:
                break
            if row.state != "ready" or in_flight.get(row.destination, 0) >= self.per_destination:
                continue
            in_flight[row.destination] = in_flight.get(row.destination, 0) + 1
            row.state, row.owner, row.attempts = "running", owner, row.attempts + 1
            taken.append(_claimed(row))
        self.claims.append(len(taken))
        self.claimed_event.set()
        return ClaimResult(taken)

    def _holds(self, owner: str, message_id: int, attempt: int) -> Row | None:
        row = self.rows.get(message_id)
        if row is None or row.state != "running":
            return None
        return row if (row.owner, row.attempts) == (owner, attempt) else None

    async def renew(self, owner: str, held: Sequence[tuple[int, int]]) -> set[int]:
        self._call("renew")
        return {mid for mid, attempt in held if self._holds(owner, mid, attempt)}

    async def complete(
        self, owner: str, batch: Sequence[Completion]
    ) -> tuple[set[int], dict[int, str]]:
        self._call("complete")
        applied = set()
        for completion in batch:
            row = self._holds(owner, completion.id, completion.attempt)
            if row is None:
                continue
            row.outcomes.append(completion)
            row.state, row.owner = completion.state, None
            applied.add(completion.id)
        return applied, {}

    async def recorded(self, owner: str, batch: Sequence[Completion]) -> set[int]:
        self._call("recorded")
        return set()

    async def rescue(self, limit: int = 1000) -> list[tuple[int, str]]:
        self._call("rescue")
        return []

    async def remove_history(
        self,
        limit: int,
        *,
        delivered_floor: datetime | None = None,
        attempts_floor: datetime | None = None,
    ) -> Removed:
        self._call("retention")
        return Removed(0)

    async def expire_payloads(self, limit: int) -> list[Erased]:
        self._call("expire_payloads")
        return []

    async def history_partitions(self) -> list[Partition]:
        self._call("history_partitions")
        return []

    async def extend_history(self, ahead: float, step: str, most: int = 4) -> list[str]:
        self._call("partitions")
        return []

    async def turn_keys(self) -> int | None:
        self._call("partitions")
        return None

    async def carry_keys(self, limit: int) -> int | None:
        self._call("partitions")
        return None

    async def drop_partition(self, partition: str) -> bool:
        self._call("partitions")
        return False

    async def backlog(self, top: int, cap: int = 10_000) -> list[Backlog]:
        self._call("backlog")
        return []

    async def work_remaining(self) -> tuple[int, int, int]:
        self._call("work_remaining")
        states = [row.state for row in self.rows.values()]
        return states.count("ready"), states.count("running"), 0

    async def health(self, statement: str, **params: Any) -> HealthRow | None:
        self._call("health")
        return None

    async def alert_lag(
        self, oldest_s: float, threshold_s: float, destination: str | None
    ) -> str | None:
        self._call("alert_lag")
        self.lag_reports.append((oldest_s, threshold_s, destination))
        return None

    async def alert_unknown_key(
        self, key_id: str, endpoint_id: int | None, dispatcher: str
    ) -> list[int]:
        self._call("alert_unknown_key")
        self.key_alerts.append((key_id, endpoint_id))
        return []


def _claimed(row: Row) -> Claimed:
    return Claimed(
        id=row.id,
        idempotency_key=f"key-{row.id}",
        url=row.url,
        method="POST",
        headers={},
        body=b"{}",
        content_type="application/json",
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        endpoint_id=None,
        event_type=None,
        created_at=datetime.now(UTC),
        destination=row.destination,
        retry_base=0,
        secrets=None,
        secret_keys=None,
        ordering_key=None,
        trace_context=None,
        retry_schedule=None,
        probe=False,
        ca_bundle=None,
        client_cert=None,
        client_key=None,
        client_key_id=None,
        auth=None,
        auth_key_id=None,
    )


class ScriptedClient:
    """An :class:`~dispatchers.delivery.http.HttpClient` that answers ``status``
    (per URL in ``statuses``, else 200) and records each request; while
    ``gate`` is clear, requests wait for it."""

    def __init__(self, statuses: Mapping[str, int] | None = None) -> None:
        self.statuses = dict(statuses or {})
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        body: bytes,
        tls: ssl.SSLContext | None = None,
        read_limit: int | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        self.requests.append((url, dict(headers)))
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        return self.statuses.get(url, 200), {}, b""

    async def aclose(self) -> None:
        return None
