"""A dispatcher's session connection: its advisory locks and ``LISTEN``.

One connection per dispatcher, never pooled (session-level locks and LISTEN die
with their session, which is what frees them when a dispatcher dies). The waker
(:mod:`dispatchers.runtime.waker`) decides when to take and release what; this
module runs the statements (``waker_*``) and watches the socket for
notifications. The lock keys are the schema's: dispatchers of different schemas
never meet.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

import psycopg
from psycopg.rows import scalar_row

from dispatchers.store.statements import store_queries
from outbox.internal import DUTY_LOCK_CLASS, lock_object_id

Key = tuple[int, int]
"""An advisory lock in its two-int form."""


def duty_lock_key(schema: str) -> Key:
    """The advisory lock of the dispatcher on duty for ``schema``."""
    return DUTY_LOCK_CLASS, lock_object_id(schema)


def wake_lock_key(schema: str) -> Key:
    """The advisory lock a dispatcher holds while it waits to be notified, which
    producers try to take shared (see the ``{notify}`` part of the enqueue
    statements)."""
    return store_queries(schema).wake_lock


class Session:
    """An open session connection of ``schema`` (see :meth:`connect`)."""

    def __init__(
        self, conn: psycopg.AsyncConnection[Any], schema: str, on_notify: Callable[[], None]
    ) -> None:
        self._conn = conn
        self._queries = store_queries(schema)
        self._on_notify = on_notify
        self.round_trips = 0  # statements sent

    @classmethod
    async def connect(
        cls,
        conninfo: str,
        schema: str,
        *,
        connect_timeout: float,
        on_notify: Callable[[], None],
    ) -> Session:
        """Connect (autocommit); ``on_notify`` is called for each notification,
        whether it arrives during a statement or a :meth:`wait`."""
        conn = await psycopg.AsyncConnection.connect(
            conninfo, autocommit=True, connect_timeout=max(1, int(connect_timeout))
        )
        conn.add_notify_handler(lambda _: on_notify())
        return cls(conn, schema, on_notify)

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._conn.close()

    async def configure(self, *, lock_timeout: float, statement_timeout: float) -> None:
        """Bound the session's lock waits and statements (seconds)."""
        await self._run(
            "waker_session",
            {
                "lock_timeout": f"{int(lock_timeout * 1000)}ms",
                "statement_timeout": f"{int(statement_timeout * 1000)}ms",
            },
        )

    async def listen(self) -> None:
        await self._run("waker_listen")

    async def unlisten(self) -> None:
        await self._run("waker_unlisten")

    async def lock(self, key: Key) -> bool:
        """Wait for the session lock ``key``, at most the lock timeout; say
        whether it was taken."""
        try:
            await self._run("waker_lock", _lock(key))
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    async def try_lock(self, key: Key) -> bool:
        """Take the session lock ``key`` if it is free; say whether it was."""
        return bool(await self._run("waker_try_lock", _lock(key)))

    async def unlock(self, key: Key) -> None:
        await self._run("waker_unlock", _lock(key))

    async def unlock_all(self) -> None:
        await self._run("waker_unlock_all")

    async def _run(self, name: str, params: Mapping[str, Any] | None = None) -> Any:
        """Run the statement ``name``; return its one value, if it has one."""
        self.round_trips += 1
        async with self._conn.cursor(row_factory=scalar_row) as cur:
            await cur.execute(self._queries[name].query, params)
            return await cur.fetchone() if cur.description else None

    async def wait(self, changed: asyncio.Event, seconds: float | None) -> None:
        """Wait for a notification, for ``changed`` or for ``seconds``, with
        nothing sent.

        The socket is watched directly (psycopg would hold the connection for the
        whole wait); notifications are read from libpq's buffer once it is
        readable. Raises if the server went away (the caller reconnects).
        """
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        conn = self._conn
        fd = conn.fileno()
        loop.add_reader(fd, readable.set)
        try:
            waits = [asyncio.ensure_future(e.wait()) for e in (readable, changed)]
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
                self._on_notify()
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the listen connection was closed")


def _lock(key: Key) -> dict[str, int]:
    """The parameters of the advisory lock statements for the two-int ``key``."""
    return {"class": key[0], "object": key[1]}
