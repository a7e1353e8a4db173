"""The claim: which of the three claim statements (``sql/claim.sql``) a dispatcher
runs, in what order, with what parameters, and what it learns from their answers.

The statements decide which messages are taken (fairly across destinations,
within their policies and breakers); this module decides which statement asks:
the short ``claim_lone`` while one destination is alone with ready messages, the
cheaper ``claim_uncapped`` while no destination has a policy, ``claim`` (with
its slots and rate wait) otherwise. What it needs of the dispatcher is the
requests in flight per destination (``busy``) and the destination the last
claim found alone (``alone``), both kept by the runtime's in-flight bookkeeping
(:class:`~dispatchers.runtime.flights.Flights`). It runs statements through the
store's runner, one bounded round trip each.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from dispatchers.store.messages import Claimed, ClaimResult, Signal
from dispatchers.store.protocol import Busy
from dispatchers.store.settings import StoreSettings
from dispatchers.store.statements import store_queries
from outbox.internal import Statement

CAPPED_RECHECK = 60.0
"""Seconds a dispatcher that met a destination with a policy (a capped endpoint, a
rate limit, a capped origin) claims with the slots before it tries the cheaper
claim of an outbox without policies again."""


Run = Callable[[Statement, dict[str, Any]], Awaitable[list[Claimed | Signal]]]
"""Runs one claim statement with its parameters; returns its rows."""


def _messages(rows: Sequence[Claimed | Signal]) -> list[Claimed]:
    return [row for row in rows if isinstance(row, Claimed)]


class Claims:
    """The claim strategy of one dispatcher's store.

    :param run: runs a claim statement (bounded by the claim timeout).
    :param settings: the lease and the bound per destination.
    """

    def __init__(self, run: Run, settings: StoreSettings) -> None:
        self._run = run
        self.settings = settings
        self.queries = store_queries(settings.schema)
        self._capped_until = 0.0  # claim with the slots until then (see claim)

    def statement(
        self,
        owner: str,
        limit: int,
        *,
        capped: bool,
        busy: Busy = None,
        alone: str | None = None,
        lone: bool = False,
    ) -> tuple[Statement, dict[str, Any]]:
        """The claim statement and its parameters: ``claim`` if some destination may
        have a policy, else the cheaper ``claim_uncapped``, or with ``lone`` the
        short ``claim_lone`` for the destination ``alone``. ``busy`` counts
        the requests in flight per destination, which leave that much less room
        there under the bound per destination; ``alone`` names the destination
        the last claim found alone with ready messages, which the statement takes
        from by a plain scan while that still holds."""
        busy = busy or {}
        name = "claim" if capped else "claim_lone" if lone else "claim_uncapped"
        return (
            self.queries[name],
            {
                "owner": owner,
                "limit": limit,
                "lease_s": self.settings.lease,
                "per_destination": self.settings.per_destination,
                "busy": list(busy),
                "busy_counts": list(busy.values()),
                "alone": alone,
            },
        )

    async def claim(
        self, owner: str, limit: int, busy: Busy = None, alone: str | None = None
    ) -> ClaimResult:
        """Claim up to ``limit`` due messages, shared across their destinations, at
        most ``config.per_destination`` in flight to each, ``busy`` (requests in
        flight per destination) included, unless one is alone with ready messages
        (``alone``: the one the last claim found so, see :meth:`statement`).

        ``claim_lone`` first when the destination ``alone`` has room under the
        bound: while it still is alone and has no policy, nothing else is needed.
        Otherwise (it says so and takes nothing) ``claim_uncapped``, which passes
        over the messages of destinations with a policy (a cap or a rate limit) and
        says whether there are any; if so, the rest is claimed with ``claim``
        (which takes their slots), and so is every claim for
        :data:`CAPPED_RECHECK` seconds. ``claim`` also says when the next rate slot
        of a rate-limited destination frees (:attr:`ClaimResult.rate_wait`).
        """
        taken: list[Claimed] = []
        if time.monotonic() >= self._capped_until:
            if alone is not None and (busy or {}).get(alone, 0) < self.settings.per_destination:
                rows = await self._run(
                    *self.statement(owner, limit, capped=False, alone=alone, lone=True)
                )
                if not rows or not isinstance(rows[-1], Signal):
                    return ClaimResult(_messages(rows))
                alone = None  # no longer alone, or not the short way's: the general claim
            rows = await self._run(
                *self.statement(owner, limit, capped=False, busy=busy, alone=alone)
            )
            taken = _messages(rows)
            if len(taken) == len(rows):
                return ClaimResult(taken)
            self._capped_until = time.monotonic() + CAPPED_RECHECK
        rate_wait = None
        if len(taken) < limit:
            busy = collections.Counter(busy or {})
            busy.update(claimed.destination for claimed in taken)
            try:
                rows = await self._run(
                    *self.statement(owner, limit - len(taken), capped=True, busy=busy, alone=alone)
                )
            except Exception:
                if not taken:
                    raise
                # The messages claimed already are held: hand them out now; the
                # next claim meets the error again if it persists.
            else:
                taken += _messages(rows)
                waits = [r.rate_wait for r in rows if isinstance(r, Signal)]
                rate_wait = next((wait for wait in waits if wait is not None), None)
        return ClaimResult(taken, rate_wait)
