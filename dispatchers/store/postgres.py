"""The dispatcher's database access: a small pool and bounded statements.

Every statement runs in its own short transaction whose timeouts are set with
``set_config(..., is_local => true)``: no session state and no startup parameters,
so the dispatcher works behind PgBouncer in transaction mode. The statements
themselves live in ``dispatchers/store/sql`` (:mod:`dispatchers.store.statements`).

The module stays whole: one ``Store._run`` decides how every statement is sent (its
session statement, preparing and re-planning, the deadline on its answer), and each
method around it is a thin wrapper of one statement, its parameters and its rows
(the claim's strategy, which statement asks when, is :mod:`dispatchers.store.claim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import weakref
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg.rows import BaseRowFactory, TupleRow

from dispatchers.store.claim import Claims
from dispatchers.store.messages import Claimed, ClaimResult, Completion, Signal, claim_rows
from dispatchers.store.protocol import Busy
from dispatchers.store.rows import (
    Backlog,
    Carried,
    Completed,
    Dropped,
    Erased,
    HealthRow,
    KeyAlerted,
    LagAlerted,
    Made,
    Partition,
    Recorded,
    Remaining,
    Removed,
    Renewed,
    Rescued,
    Turned,
    named_row,
)
from dispatchers.store.settings import StoreSettings
from dispatchers.store.statements import store_queries
from outbox.internal import Statement

R = TypeVar("R")

TIMEOUT_PARAMS = ("outbox_statement_timeout", "outbox_lock_timeout", "outbox_idle_timeout")
"""The parameters of ``set_timeouts`` (and ``set_timeouts_prepared``), sent ahead of
each statement in the same message: local to its implicit transaction, so no session
state is left behind (PgBouncer in transaction mode is fine)."""

_PREPARED = frozenset(
    {"claim", "claim_uncapped", "claim_lone", "complete", "complete_delivered", "renew"}
)
"""The statements run per batch, prepared (see ``Store._run``); the occasional ones
(rescue, retention, the drain check) are planned at each run, for their values. A
prepared statement goes after ``set_timeouts_prepared`` (the timeouts, and a generic
plan, once per connection: planning the claim costs more than running it).

A generic plan is made for the hot table's size at the time, which swings between
empty and a backlog of millions: made while it was nearly empty, the claim would
read the whole table at every claim. So a connection's plans are made again once
``set_timeouts_prepared`` reports the table :data:`REPLAN_GROWTH` times past the size
they were made for (and past :data:`REPLAN_FLOOR` pages); from there up, every plan
reaches its rows by index (``tests/store/test_statement_plans.py``). No planner
switch forces the indexes: ``enable_seqscan = off`` did, by adding 10^10 to the
alternative's cost, past every JIT threshold up to PostgreSQL 17."""

REPLAN_GROWTH = 4
"""Plans are made again when the hot table has grown this many times (in pages)..."""

REPLAN_FLOOR = 64
"""...and past this many pages (512 KiB): read whole, fewer cost under a millisecond."""

BACKLOG_CAP = 10_000
"""The most ready messages the backlog counts per destination: a destination
that shows this many has at least as many."""


DDL_LOCK_TIMEOUT = 0.5
"""Seconds the statements that make or drop a partition of the history wait for
their lock on the parent table (ACCESS EXCLUSIVE, for a moment). While one waits,
every completion waits behind it: a short wait, failing behind a long reader and
tried again at the next round, stalls them for no longer than this."""

RECONNECT_TIMEOUT = 2.0
"""Seconds the pool goes on trying to replace a lost connection (after 1 s, then
at this bound) before it gives up until a statement asks for one: then it tries
again at once. psycopg_pool's own default (five minutes, the pause doubling
from 1 s) left deliveries waiting up to half an outage more once the database
was back; statements ask every few seconds while it is away (the claim loop,
the renewals), so nothing is left without a connection."""


def stale_plan(planned_pages: int, pages: int) -> bool:
    """Whether a plan made for ``planned_pages`` pages is to be made again at ``pages``."""
    return pages >= max(REPLAN_GROWTH * planned_pages, REPLAN_FLOOR)


def timeout_values(config: StoreSettings, statement_timeout: float) -> tuple[str, str, str]:
    """The values of :data:`TIMEOUT_PARAMS` for statements bounded by
    ``statement_timeout``: it, and ``config``'s lock and idle timeouts."""
    return (
        f"{int(statement_timeout * 1000)}ms",
        f"{int(config.lock_timeout * 1000)}ms",
        f"{int(config.idle_in_transaction_timeout * 1000)}ms",
    )


def answer_bound(timeout: float) -> float:
    """How long to wait for the answer to a statement that PostgreSQL bounds by
    ``timeout``: that, plus as much again (at least 1 s) for the network."""
    return timeout + max(1.0, timeout)


class _Deadline:
    """Ends the wait for a statement's answer after ``seconds``, however it is stuck.

    PostgreSQL's statement_timeout cannot end a statement that is stuck on the way
    to the server or an answer stuck on the way back (a stalled network or pooler).
    Past the bound, the connection's socket is shut down: the wait ends at once with
    a connection error, the connection is discarded, and the caller sees a transient
    error. Cancelling the task instead would make psycopg send a cancel request and
    wait for it, over the same stalled network.
    """

    def __init__(self, conn: psycopg.AsyncConnection[Any], seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._conn = conn
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        with contextlib.suppress(OSError, psycopg.Error):
            dup = socket.socket(fileno=os.dup(self._conn.fileno()))
            try:
                dup.shutdown(socket.SHUT_RDWR)
            finally:
                dup.close()

    def cancel(self) -> None:
        self._timer.cancel()


def _ignore_outcome(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so that asyncio does not log it


class Store:
    """The statements one dispatcher runs, on a pool of a few connections.

    ``name`` is the pool's, which psycopg_pool's own log records carry (a process
    serving several databases names each pool for its database's label)."""

    def __init__(
        self, conninfo: str, config: StoreSettings, *, name: str = "outbox-dispatcher"
    ) -> None:
        self.config = config
        self.queries = store_queries(config.schema)
        # Each statement goes out behind its timeouts, in one message: the text is
        # built from these parts at each call (see _run).
        self._set_timeouts = self.queries["set_timeouts"].text + ";\n"
        self._set_prepared = self.queries["set_timeouts_prepared"].text + ";\n"
        self.round_trips = 0  # statements sent; each is one network round trip
        self._timeouts = timeout_values(config, config.statement_timeout)
        self._claim_timeouts = timeout_values(config, config.claim_timeout)
        self._ddl_timeouts = (
            self._timeouts[0],
            f"{int(DDL_LOCK_TIMEOUT * 1000)}ms",
            self._timeouts[2],
        )
        # the statements prepared on each connection, and the size of the hot
        # table (pages) when each was planned (see _run)
        self._prepared: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], dict[str, int]] = (
            weakref.WeakKeyDictionary()
        )
        self.replans = 0  # plans made again for a grown table (see _run)
        self._bounds: dict[tuple[str, ...], float] = {
            self._timeouts: answer_bound(config.statement_timeout),
            self._claim_timeouts: answer_bound(config.claim_timeout),
            self._ddl_timeouts: answer_bound(config.statement_timeout),
        }
        # autocommit: each statement is its own implicit transaction (see _run)
        kwargs: dict[str, Any] = {
            "connect_timeout": max(1, int(config.db_connect_timeout)),
            "autocommit": True,
        }
        self.pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[TupleRow]] = (
            psycopg_pool.AsyncConnectionPool(
                conninfo,
                min_size=1,
                max_size=4,
                kwargs=kwargs,
                open=False,
                timeout=config.statement_timeout,
                reconnect_timeout=RECONNECT_TIMEOUT,
                name=name,
            )
        )
        self._sweep: asyncio.Task[None] | None = None  # see _swept
        self._claims = Claims(self._run_claim, config)

    async def _run_claim(
        self, statement: Statement, params: dict[str, Any]
    ) -> list[Claimed | Signal]:
        """Run one claim statement, bounded by the claim timeout."""
        return await self._run(statement, params, claim_rows, timeouts=self._claim_timeouts)

    async def open(self) -> None:
        await self.pool.open(wait=False)

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweep
        await self.pool.close(timeout=self.config.statement_timeout)

    def _swept(self) -> None:
        """A connection was lost: test the pool's idle ones in the background
        (``pool.check``), so that those lost with it (the server went away) are
        replaced now, not handed to the next statements one failure at a time
        after the server is back. One sweep at a time."""
        if self._sweep is None or self._sweep.done():
            self._sweep = asyncio.create_task(self.pool.check(), name="outbox-pool-check")
            # a sweep that fails (the pool closing) has nothing to report: the
            # statements that need a connection say what is wrong
            self._sweep.add_done_callback(_ignore_outcome)

    async def _run(
        self,
        statement: Statement,
        params: dict[str, Any],
        row: BaseRowFactory[R],
        *,
        timeouts: tuple[str, ...] | None = None,
    ) -> list[R]:
        """Run one statement in its own bounded transaction; return its rows.

        The timeouts and the statement go out as one simple-protocol message
        (values bound client-side), which PostgreSQL runs as one implicit
        transaction and commits before it reads anything more from us: one
        network round trip, and however the dispatcher stalls once it has sent
        it (frozen, paused, cut off), the server never waits on it holding row
        locks. A BEGIN ... COMMIT pipeline did: a dispatcher frozen before its
        COMMIT went out kept its rows locked for as long as it stayed frozen, out
        of reach of every timeout (a backend reading the rest of a pipeline is not
        idle in transaction), so the rescuer skipped its leases and they never
        expired.
        With ``prepared_statements``, the statement is called by its prepared name,
        and the same message prepares it first on a connection that has not, or
        prepares it again when the hot table has outgrown the plan (see
        :data:`_PREPARED`). A server connection that lacks it (a pooler moved us) or
        has it already (a peer prepared it) costs one more try; after two, it is
        sent unprepared.
        The answer is awaited at most :func:`answer_bound` of the statement's
        timeout; past that, :class:`TimeoutError` (transient), and the statement
        may or may not have committed.
        """
        try:
            return await self._run_pooled(statement, params, row, timeouts=timeouts)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if exc.sqlstate is None and not isinstance(exc, psycopg_pool.PoolTimeout):
                self._swept()  # the connection was lost: others may be too
            raise

    async def _run_pooled(
        self,
        statement: Statement,
        params: dict[str, Any],
        row: BaseRowFactory[R],
        *,
        timeouts: tuple[str, ...] | None,
    ) -> list[R]:
        """:meth:`_run` on a connection of the pool."""
        timeouts = timeouts or self._timeouts
        async with self.pool.connection() as conn:
            bound = self._bounds.get(timeouts) or answer_bound(self.config.statement_timeout)
            values = {**params, **dict(zip(TIMEOUT_PARAMS, timeouts, strict=True))}
            if not self.config.prepared_statements or statement.name not in _PREPARED:
                rows, _ = await self._send(
                    conn, bound, self._set_timeouts + statement.text, values, row
                )
                return rows
            # Prepared on this server connection as needed, in the same message:
            # planned once per connection instead of at every execution.
            prepared = statement.prepared
            planned = self._prepared.setdefault(conn, {})
            for _ in range(2):
                text = self._set_prepared
                if prepared.name not in planned:
                    text += prepared.prepare + ";\n"
                elif planned[prepared.name] < 0:  # outgrown: made again
                    text += f"DEALLOCATE {prepared.name};\n{prepared.prepare};\n"
                try:
                    rows, pages = await self._send(
                        conn, bound, text + prepared.execute, values, row, sized=True
                    )
                except psycopg.errors.InvalidSqlStatementName:
                    # not on this server connection (a pooler moved us): prepare again
                    planned.pop(prepared.name, None)
                    continue
                except psycopg.errors.DuplicatePreparedStatement:
                    # prepared there already, by us or a peer: planned at about this size
                    planned[prepared.name] = 0
                    continue
                was = planned.get(prepared.name)
                if was is None or was < 0:
                    if was is not None:
                        self.replans += 1
                    planned[prepared.name] = pages
                elif stale_plan(was, pages):
                    planned[prepared.name] = -1  # made again at its next execution
                return rows
            # A pooler keeps moving us between server connections: run it unprepared.
            rows, _ = await self._send(
                conn, bound, self._set_timeouts + statement.text, values, row
            )
            return rows

    async def _send(
        self,
        conn: psycopg.AsyncConnection[Any],
        bound: float,
        text: str,
        values: dict[str, Any],
        row: BaseRowFactory[R],
        *,
        sized: bool = False,
    ) -> tuple[list[R], int]:
        """Send ``text`` (statements separated by ``;``) as one message; return the
        rows of the last, made by ``row``, waiting at most ``bound`` seconds for them,
        and with ``sized`` the hot table's size that the first (``set_timeouts_prepared``)
        reported (else 0)."""
        self.round_trips += 1
        deadline = _Deadline(conn, bound)
        pages = 0
        try:
            cur = psycopg.AsyncClientCursor(conn, row_factory=row)
            await cur.execute(text, values)
            if sized and cur.pgresult is not None:
                # the last column of the set_config row, read without the row factory
                result = cur.pgresult
                pages = int(result.get_value(0, result.nfields - 1) or b"0")
            while cur.nextset():  # past the set_config row (and PREPARE), to the last
                pass
            rows = await cur.fetchall()
        except psycopg.Error as exc:
            if not deadline.expired:
                raise
            await conn.close()
            raise TimeoutError(
                f"no answer from the database within {deadline.seconds:g} s"
            ) from exc
        finally:
            deadline.cancel()
        if deadline.expired:  # answered just as the bound passed: do not reuse it
            await conn.close()
        return rows, pages

    def claim_statement(
        self,
        owner: str,
        limit: int,
        *,
        capped: bool,
        busy: Busy = None,
        alone: str | None = None,
        lone: bool = False,
    ) -> tuple[Statement, dict[str, Any]]:
        """One claim statement and its parameters (see
        :meth:`dispatchers.store.claim.Claims.statement`)."""
        return self._claims.statement(
            owner, limit, capped=capped, busy=busy, alone=alone, lone=lone
        )

    async def claim(
        self, owner: str, limit: int, busy: Busy = None, alone: str | None = None
    ) -> ClaimResult:
        """Claim up to ``limit`` due messages: the strategy of
        :meth:`dispatchers.store.claim.Claims.claim`."""
        return await self._claims.claim(owner, limit, busy, alone)

    async def renew(self, owner: str, held: Sequence[tuple[int, int]]) -> set[int]:
        """Extend every lease in ``held`` (id, attempt); return the ids still held."""
        rows = await self._run(
            self.queries["renew"],
            {
                "owner": owner,
                "lease_s": self.config.lease,
                "ids": [h[0] for h in held],
                "attempts": [h[1] for h in held],
            },
            named_row(Renewed),
        )
        return {r.id for r in rows}

    def complete_statement(
        self, owner: str, batch: Sequence[Completion]
    ) -> tuple[Statement, dict[str, Any]]:
        """The statement that records ``batch``, and its parameters: the cheaper
        ``complete_delivered`` when every outcome is a sent success, else
        ``complete``."""
        params: dict[str, Any] = {
            "owner": owner,
            "ids": [c.id for c in batch],
            "endpoint_ids": [c.endpoint_id for c in batch],
            "attempts": [c.attempt for c in batch],
            "statuses": [c.status for c in batch],
            "outcomes": [c.outcome for c in batch],
            "error_classes": [c.error_class for c in batch],
            "errors": [c.error for c in batch],
            "started": [c.started_at for c in batch],
            "durations": [c.duration_ms for c in batch],
            "excerpts": [c.excerpt for c in batch],
        }
        if all(c.state == "delivered" and c.sent for c in batch):
            return self.queries["complete_delivered"], params
        params["disable_after_s"] = self.config.disable_after
        params["states"] = [c.state for c in batch]
        params["delays"] = [c.delay for c in batch]
        params["sent"] = [c.sent for c in batch]
        return self.queries["complete"], params

    async def complete(
        self, owner: str, batch: Sequence[Completion]
    ) -> tuple[set[int], dict[int, str]]:
        """Record a batch of outcomes; return the ids whose outcome was applied and
        the endpoints that are now disabled (410 Gone, or failing too long)."""
        rows = await self._run(*self.complete_statement(owner, batch), named_row(Completed))
        applied = {r.id for r in rows if r.id is not None}
        disabled = {
            r.disabled_endpoint: r.reason or "" for r in rows if r.disabled_endpoint is not None
        }
        return applied, disabled

    async def recorded(self, owner: str, batch: Sequence[Completion]) -> set[int]:
        """The ids in ``batch`` whose sent outcome ``owner`` has recorded already
        (by an earlier try of the same write whose answer was lost)."""
        sent = [c for c in batch if c.sent]
        if not sent:
            return set()
        rows = await self._run(
            self.queries["recorded_attempts"],
            {
                "owner": owner,
                "ids": [c.id for c in sent],
                "attempts": [c.attempt for c in sent],
                "outcomes": [c.outcome for c in sent],
            },
            named_row(Recorded),
        )
        return {r.message_id for r in rows}

    async def rescue(self, limit: int = 1000) -> list[tuple[int, str]]:
        """Return expired leases to ready (or dead); return (id, new state) pairs."""
        rows = await self._run(self.queries["rescue"], {"limit": limit}, named_row(Rescued))
        return [(r.id, r.state) for r in rows]

    async def remove_history(
        self,
        limit: int,
        *,
        delivered_floor: datetime | None = None,
        attempts_floor: datetime | None = None,
    ) -> Removed:
        """Delete one batch of delivered history older than the retention period
        and below the floors (the oldest partition of a range of each table: what
        is above goes a partition at a time)."""
        rows = await self._run(
            self.queries["retention"],
            {
                "retention_s": self.config.retention,
                "limit": limit,
                "delivered_floor": delivered_floor,
                "attempts_floor": attempts_floor,
            },
            named_row(Removed),
        )
        return rows[0]

    async def expire_payloads(self, limit: int) -> list[Erased]:
        """Erase, for each retention rule, up to ``limit`` delivered messages past
        its period (migration 0029); one row per rule served."""
        return await self._run(
            self.queries["expire_payloads"],
            {"limit": limit},
            named_row(Erased),
        )

    async def history_partitions(self) -> list[Partition]:
        """The partitions of delivered and attempts, oldest first."""
        return await self._run(self.queries["history_partitions"], {}, named_row(Partition))

    async def extend_history(self, ahead: float, step: str, most: int = 4) -> list[str]:
        """Make up to ``most`` of the history's partitions missing up to ``ahead``
        seconds from now, each ``step`` long; return their names (none if another
        dispatcher is making them). Its lock waits are bounded by
        :data:`DDL_LOCK_TIMEOUT`."""
        rows = await self._run(
            self.queries["history_extend"],
            {"ahead_s": ahead, "step": step, "most": most},
            named_row(Made),
            timeouts=self._ddl_timeouts,
        )
        return [r.made for r in rows]

    async def turn_keys(self) -> int | None:
        """Turn the generation of idempotency keys and event records if it is due
        (migration 0033); return the new generation, or None. It waits for the
        producers writing to the current one at most :data:`DDL_LOCK_TIMEOUT`
        (then it fails, to be tried next round)."""
        rows = await self._run(
            self.queries["key_generation_turn"],
            {"retention_s": self.config.retention},
            named_row(Turned),
            timeouts=self._ddl_timeouts,
        )
        return rows[0].generation

    async def carry_keys(self, limit: int) -> int | None:
        """After a turn, copy the keys of up to ``limit`` messages still in
        messages into the current generation; return the messages read (fewer than
        ``limit``: done), or None when there is nothing to carry."""
        rows = await self._run(
            self.queries["key_generation_carry"], {"limit": limit}, named_row(Carried)
        )
        return rows[0].carried

    async def drop_partition(self, partition: str) -> bool:
        """Drop ``partition`` if its whole range is past the retention period.
        Its lock waits are bounded by :data:`DDL_LOCK_TIMEOUT`."""
        rows = await self._run(
            self.queries["history_drop"],
            {"partition": partition, "retention_s": self.config.retention},
            named_row(Dropped),
            timeouts=self._ddl_timeouts,
        )
        return rows[0].dropped

    async def backlog(self, top: int, cap: int = BACKLOG_CAP) -> list[Backlog]:
        """The ready messages due now per destination (counted up to ``cap``
        each), for the ``top`` destinations with the most, and the rest in one
        row (destination None)."""
        return await self._run(
            self.queries["backlog"], {"top": top, "cap": cap}, named_row(Backlog)
        )

    async def work_remaining(self) -> tuple[int, int, int]:
        """(due now, running, scheduled later) across all dispatchers."""
        rows = await self._run(self.queries["work_remaining"], {}, named_row(Remaining))
        return rows[0].due, rows[0].running, rows[0].scheduled

    async def health(self, statement: str, **params: Any) -> HealthRow | None:
        """Run one of the ``health_*`` statements (a transition of a destination's
        breaker or hold, see :mod:`dispatchers.runtime.breakers`); return the row it
        changed, or None when it changed none (another dispatcher got there first,
        or the probe was no longer ours)."""
        rows = await self._run(self.queries[statement], params, named_row(HealthRow))
        return rows[0] if rows else None

    async def alert_lag(
        self, oldest_s: float, threshold_s: float, destination: str | None
    ) -> str | None:
        """Report the lag (``alert_lag``): ``exceeded`` or ``recovered`` when this
        call changed its state and raised the alert, else None."""
        rows = await self._run(
            self.queries["alert_lag"],
            {"oldest_s": oldest_s, "threshold_s": threshold_s, "destination": destination},
            named_row(LagAlerted),
        )
        return rows[0].changed

    async def alert_unknown_key(
        self, key_id: str, endpoint_id: int | None, dispatcher: str
    ) -> list[int]:
        """Raise the alert of a key this dispatcher lacks (``alert_unknown_key``);
        return its messages."""
        rows = await self._run(
            self.queries["alert_unknown_key"],
            {"key_id": key_id, "endpoint_id": endpoint_id, "dispatcher": dispatcher},
            named_row(KeyAlerted),
        )
        return rows[0].message_ids
