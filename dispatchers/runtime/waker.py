"""Wake-ups: which dispatcher claims promptly, and when producers notify it.

Each dispatcher keeps one session connection (never pooled) for two advisory
locks and ``LISTEN``:

- **the duty lock** (session-level, exclusive): the dispatcher holding it is
  *on duty*: it listens, and it claims within a few milliseconds of new work.
  The others poll every ``poll_interval`` (and keep claiming while their claims
  come back full), so one notification wakes one dispatcher, not all of them.
  The others also queue for the lock (a lock wait bounded by ``poll_interval``,
  then again), so when the dispatcher on duty stops, dies (its session ends) or
  hands duty off because all its capacity is taken, the next one is on duty at
  once: the dispatcher that claims promptly is always one with room for more.
- **the wake lock** (session-level, exclusive), held by the dispatcher on duty
  while it is *idle*, waiting for a notification. Every enqueue tries to take it
  shared for its own transaction (``pg_try_advisory_xact_lock_shared``) and calls
  ``pg_notify`` only when that fails, that is only when a dispatcher waits: a busy
  dispatcher claims on a timer instead, and producers then pay nothing for
  notifications (``NOTIFY`` serialises every notifying commit in the database).

Why no message is missed: a producer that took the lock shared holds it until
its commit is visible, so the dispatcher's try for the wake lock fails until
then, and once it succeeds, the claim it sends next sees every message whose
producer did not notify. A producer that fails to take the lock notifies at
commit, and the dispatcher holding it claims when the notification arrives.
A notification that comes when nobody needs it costs one early claim.

The lock keys are ``Queries.wake_lock`` (:mod:`outbox._queries`) and :func:`duty_lock_key`
of the schema, so dispatchers of different schemas never meet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import psycopg
from psycopg.rows import scalar_row

from dispatchers.runtime.backoff import Backoff
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.log import EventLog
from dispatchers.store.statements import store_queries
from outbox._queries import DUTY_LOCK_CLASS, lock_object_id


def duty_lock_key(schema: str) -> tuple[int, int]:
    """The advisory lock (two-int form) of the dispatcher on duty for ``schema``."""
    return DUTY_LOCK_CLASS, lock_object_id(schema)


def _lock(key: tuple[int, int]) -> dict[str, int]:
    """The parameters of the advisory lock statements for the two-int ``key``."""
    return {"class": key[0], "object": key[1]}


class Waker:
    """The session connection of one dispatcher: duty, the wake lock and LISTEN.

    ``want_wake`` (set by the claim loop) says whether the dispatcher wants to be
    notified; :meth:`run` brings the locks in line with it and calls
    ``on_change`` whenever ``on_duty`` or ``notified`` changes, and
    ``on_notify`` for each notification.
    """

    def __init__(
        self,
        conninfo: str,
        config: DispatcherConfig,
        *,
        on_notify: Callable[[], None],
        on_change: Callable[[], None],
        log: EventLog,
    ) -> None:
        self.conninfo = conninfo
        self.config = config
        self.log = log
        self._on_notify = on_notify
        self._on_change = on_change
        self._queries = store_queries(config.schema)
        self._duty = duty_lock_key(config.schema)
        self._wake = self._queries.wake_lock
        self.on_duty = False
        self.notified = False  # holds the wake lock: producers notify us
        self.want_wake = False
        self.want_duty = True
        self.notifications = 0  # received, for benchmarks and tests
        self.round_trips = 0  # statements sent
        self._changed = asyncio.Event()

    def request(self, *, wake: bool | None = None, duty: bool | None = None) -> None:
        """Ask to hold the wake lock (be notified) or to release it; to take duty
        (when it is free) or to hand it off."""
        if wake is not None and wake != self.want_wake:
            self.want_wake = wake
            self._changed.set()
        if duty is not None and duty != self.want_duty:
            self.want_duty = duty
            self._changed.set()

    async def run(self) -> None:
        """Hold duty when it is free and the wake lock as requested, until cancelled;
        reconnect after errors (locks die with the session, so nothing is stuck)."""
        backoff = Backoff(initial=0.5, maximum=10.0)
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.conninfo,
                    autocommit=True,
                    connect_timeout=max(1, int(self.config.db_connect_timeout)),
                )
                async with conn:
                    conn.add_notify_handler(lambda _: self._notified())
                    await self._serve(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.event("listen_error", error=type(exc).__name__)
            finally:
                self._set(on_duty=False, notified=False)
            await asyncio.sleep(backoff.next())

    async def _serve(self, conn: psycopg.AsyncConnection[Any]) -> None:
        # The one lock wait here (for duty) is bounded by lock_timeout; every
        # statement by statement_timeout; and the server notices a vanished
        # dispatcher (its locks are then freed) by TCP keepalives.
        poll_ms = int(self.config.poll_interval * 1000)
        await self._run(
            conn,
            "waker_session",
            {
                "lock_timeout": f"{poll_ms}ms",
                "statement_timeout": f"{poll_ms + int(self.config.statement_timeout * 1000)}ms",
            },
        )
        while True:
            if not self.on_duty and self.want_duty and await self._take_duty(conn):
                # Listen before the wake lock can be taken: a producer that sees it
                # held notifies at once, and that notification must not be lost.
                await self._run(conn, "waker_listen")
                self._set(on_duty=True, notified=False)
            if self.on_duty and not self.want_duty:
                # Hand off: the next dispatcher queued for duty takes it at once.
                await self._run(conn, "waker_unlisten")
                await self._run(conn, "waker_unlock_all")
                self._set(on_duty=False, notified=False)
            if self.on_duty:
                if self.want_wake and not self.notified:
                    if await self._try(conn, self._wake):
                        self._set(on_duty=True, notified=True)
                elif not self.want_wake and self.notified:
                    await self._run(conn, "waker_unlock", _lock(self._wake))
                    self._set(on_duty=True, notified=False)
            if not self.on_duty:
                if not self.want_duty:
                    await self._wait(conn, None)
                # else: queue for duty again at once (the wait is in _take_duty)
            elif self.want_wake == self.notified:
                await self._wait(conn, None)
            else:
                # On duty but not yet holding the wake lock (a producer holds it
                # shared until its commit): try again soon.
                await self._wait(conn, self.config.claim_window)

    async def _take_duty(self, conn: psycopg.AsyncConnection[Any]) -> bool:
        """Wait for the duty lock, at most ``poll_interval`` (the lock_timeout);
        say whether it was taken."""
        try:
            await self._run(conn, "waker_lock", _lock(self._duty))
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    async def _try(self, conn: psycopg.AsyncConnection[Any], key: tuple[int, int]) -> bool:
        """Take the session lock ``key`` if it is free; say whether it was."""
        return bool(await self._run(conn, "waker_try_lock", _lock(key)))

    async def _run(
        self,
        conn: psycopg.AsyncConnection[Any],
        name: str,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run the statement ``name``; return its one value, if it has one."""
        self.round_trips += 1
        async with conn.cursor(row_factory=scalar_row) as cur:
            await cur.execute(self._queries[name].query, params)
            return await cur.fetchone() if cur.description else None

    async def _wait(self, conn: psycopg.AsyncConnection[Any], seconds: float | None) -> None:
        """Wait for a notification, a request or ``seconds``, with nothing sent.

        The socket is watched directly (psycopg would hold the connection for the
        whole wait); notifications are read from libpq's buffer once it is readable.
        Notifications that arrive while a statement runs reach ``on_notify``
        through the connection's notify handler.
        """
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        self._changed.clear()
        fd = conn.fileno()
        loop.add_reader(fd, readable.set)
        try:
            waits = [asyncio.ensure_future(e.wait()) for e in (readable, self._changed)]
            try:
                await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        finally:
            loop.remove_reader(fd)
        if readable.is_set():
            pgconn = conn.pgconn
            pgconn.consume_input()  # raises if the server went away: reconnect
            while pgconn.notifies() is not None:
                self._notified()
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listen connection was closed")

    def _notified(self) -> None:
        self.notifications += 1
        self._on_notify()

    def _set(self, *, on_duty: bool, notified: bool) -> None:
        if (on_duty, notified) != (self.on_duty, self.notified):
            self.on_duty, self.notified = on_duty, notified
            self._on_change()
