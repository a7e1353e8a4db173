"""The six transaction kinds the library accepts, driven the same way from async tests."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outbox.dsn import sqlalchemy_url

Observer = psycopg.Connection[tuple[Any, ...]]


def wait_until_blocked_on_a_lock(observer: Observer, pid: int) -> None:
    """Return once backend ``pid`` waits on a lock; fail after 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row is not None and row[0] == "Lock":
            return
        time.sleep(0.005)
    raise AssertionError(f"backend {pid} never waited on a lock")


KINDS = [
    "sqlalchemy-session",
    "sqlalchemy-connection",
    "sqlalchemy-async-session",
    "sqlalchemy-async-connection",
    "psycopg-connection",
    "psycopg-async-connection",
]


@dataclass
class Tx:
    """One open transaction handle of one kind."""

    kind: str
    raw: Any
    is_async: bool

    async def call(
        self, sync: Callable[..., Any], async_: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Call the sync or async flavour of a library function, as this kind needs."""
        if self.is_async:
            return await async_(self.raw, *args, **kwargs)
        return sync(self.raw, *args, **kwargs)

    async def call_other_mode(
        self, sync: Callable[..., Any], async_: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Call the flavour this kind does NOT support (it must refuse)."""
        if self.is_async:
            return sync(self.raw, *args, **kwargs)
        return await async_(self.raw, *args, **kwargs)

    async def commit(self) -> None:
        await _settle(self.raw.commit())

    async def rollback(self) -> None:
        await _settle(self.raw.rollback())

    def in_transaction(self) -> bool:
        """Whether anything was sent to the server since the last commit/rollback."""
        if isinstance(self.raw, psycopg.Connection | psycopg.AsyncConnection):
            return self.raw.info.transaction_status != TransactionStatus.IDLE
        return bool(self.raw.in_transaction())


async def _settle(result: Any) -> None:
    if inspect.isawaitable(result):
        await result


async def open_tx(kind: str, url: str, stack: AsyncExitStack) -> Tx:
    """Open a transaction handle of ``kind``; ``stack`` closes it (never commits)."""
    if kind.startswith("sqlalchemy-async"):
        engine = create_async_engine(sqlalchemy_url(url))
        stack.push_async_callback(engine.dispose)
        if kind == "sqlalchemy-async-session":
            session = AsyncSession(engine)
            stack.push_async_callback(session.close)
            return Tx(kind, session, is_async=True)
        connection = await engine.connect()
        stack.push_async_callback(connection.close)
        return Tx(kind, connection, is_async=True)
    if kind.startswith("sqlalchemy"):
        sync_engine = create_engine(sqlalchemy_url(url))
        stack.callback(sync_engine.dispose)
        if kind == "sqlalchemy-session":
            sync_session = Session(sync_engine)
            stack.callback(sync_session.close)
            return Tx(kind, sync_session, is_async=False)
        sync_connection = sync_engine.connect()
        stack.callback(sync_connection.close)
        return Tx(kind, sync_connection, is_async=False)
    if kind == "psycopg-async-connection":
        aconn = await psycopg.AsyncConnection.connect(url)
        stack.push_async_callback(aconn.close)
        return Tx(kind, aconn, is_async=True)
    conn = psycopg.connect(url)
    stack.callback(conn.close)
    return Tx(kind, conn, is_async=False)
