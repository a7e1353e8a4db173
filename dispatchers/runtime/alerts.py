"""The alerts a dispatcher raises itself.

Most alerts are raised by database triggers; the two that need a dispatcher to
notice them go through functions of migration ``0028_alerts.sql``, which alert
once per occurrence however many dispatchers notice it: :class:`LagWatch` (the
oldest due message's wait, with ``--lag-alert``) and :class:`KeyAlerts` (a secret
sealed under a key this dispatcher lacks, once per key and hour).

Design: docs/explanation/design/alerts.md
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from dispatchers.runtime import loop as loops
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.protocol import DispatchStore
from dispatchers.store.rows import Backlog

__all__ = ["SETTLE_WITHIN", "KeyAlerts", "LagWatch"]

HOUR = 3600.0

SETTLE_WITHIN = 5.0
"""Seconds a shutdown waits for the alerts being raised; those still under way
are then cancelled (a dispatcher raises them again, the next time it finds the
key missing)."""


class LagWatch:
    """Reports the lag of each backlog read to the database (``alert_lag``),
    which alerts once per crossing of ``threshold`` seconds."""

    def __init__(self, store: DispatchStore, report: Reporter, *, threshold: float) -> None:
        self.store = store
        self.report = report
        self.threshold = threshold

    async def observed(self, rows: Sequence[Backlog]) -> str | None:
        """Report the oldest wait among ``rows`` (0 when none is due); return
        ``exceeded`` or ``recovered`` when this report changed the lag's state."""
        oldest = max(rows, key=lambda row: row.oldest_s, default=None)
        waited = max(0.0, oldest.oldest_s) if oldest is not None else 0.0
        destination = oldest.destination if oldest is not None else None
        changed = await self.store.alert_lag(waited, self.threshold, destination)
        if changed is not None:
            self.report.lag_changed(changed, oldest_s=waited, threshold_s=self.threshold)
        return changed


class KeyAlerts:
    """Raises ``outbox.secrets.unknown_key`` for each key this dispatcher found
    missing, in the background (the claim loop never waits for it), at most once
    per key and hour of this process: the database keeps it to once per key and
    hour across every dispatcher."""

    operation = "alert"

    def __init__(
        self,
        store: DispatchStore,
        report: Reporter,
        *,
        owner: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.report = report
        self.owner = owner
        self._clock = clock
        self._raised: dict[str, int] = {}  # key id -> the hour it was raised in
        self._tasks: set[asyncio.Task[None]] = set()

    def missing(self, key_ids: Sequence[str], endpoint_id: int | None) -> None:
        """Keys ``key_ids`` that a secret of ``endpoint_id`` is sealed under are
        not configured here: raise the alert of each not raised this hour."""
        hour = int(self._clock() // HOUR)
        for key_id in key_ids:
            if self._raised.get(key_id) == hour:
                continue
            self._raised[key_id] = hour  # also while it is sent: one at a time
            task = asyncio.create_task(self._raise(key_id, endpoint_id, hour))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _raise(self, key_id: str, endpoint_id: int | None, hour: int) -> None:
        try:
            await self.store.alert_unknown_key(key_id, endpoint_id, self.owner)
        except Exception as exc:
            if self._raised.get(key_id) == hour:
                del self._raised[key_id]  # the next message of that key tries again
            self.report.db_error(self.operation, exc)
        else:
            self.report.answered(self.operation)

    async def settle(self, within: float = SETTLE_WITHIN) -> None:
        """Wait for the alerts being raised (at shutdown, before the store closes),
        at most ``within`` seconds; cancel those still under way, and say so."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=within)
        if pending:
            self.report.abandoned(self.operation, len(pending), within)
            await loops.stop_tasks(pending, within=min(within, 1.0))
