"""Running statements in the caller's transaction, whatever kind it is.

The library's write paths are written once as *plans*: generators that yield
``(statement, params)`` and receive the rows. :func:`run_sync` and
:func:`run_async` drive a plan on one of the six supported transaction kinds, so
sync and async share every query and every decision; only the I/O differs.
Nothing here commits, rolls back or opens a connection.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import tuple_row

from outbox.queries import Statement

if TYPE_CHECKING:
    from psycopg.pq.abc import PGresult

T = TypeVar("T")
Row = Sequence[Any]
Plan = Generator[tuple[Statement, dict[str, Any]], list[Row], T]

SYNC_KINDS = "a SQLAlchemy Session or Connection, or a psycopg Connection"
ASYNC_KINDS = "a SQLAlchemy AsyncSession or AsyncConnection, or a psycopg AsyncConnection"
TUPLES_OK = ExecStatus.TUPLES_OK


def _sqlalchemy_kind(tx: object) -> str | None:
    """ "sync" or "async" for a SQLAlchemy session/connection, else None.

    SQLAlchemy is only looked at if the application imported it, so psycopg-only
    applications never pay for importing it.
    """
    orm = sys.modules.get("sqlalchemy.orm")
    engine = sys.modules.get("sqlalchemy.engine")
    if (orm and isinstance(tx, orm.Session)) or (engine and isinstance(tx, engine.Connection)):
        return "sync"
    ext = sys.modules.get("sqlalchemy.ext.asyncio")
    if ext and isinstance(tx, ext.AsyncSession | ext.AsyncConnection):
        return "async"
    return None


def _rows(result: PGresult | None) -> bool:
    """Whether a statement's result has rows to fetch. Cheaper than the cursor's
    ``description``, which builds a Column object per column."""
    return result is not None and result.status == TUPLES_OK


def _execute_sync(tx: object, statement: Statement, params: dict[str, Any]) -> list[Row]:
    if isinstance(tx, psycopg.Connection):
        # tuples whatever row factory the application gave its connection
        with tx.cursor(row_factory=tuple_row) as cur:
            cur.execute(statement.query, params)
            return cast(list[Row], cur.fetchall()) if _rows(cur.pgresult) else []
    kind = _sqlalchemy_kind(tx)
    if kind == "sync":
        result = tx.execute(statement.sqlalchemy, params)  # type: ignore[attr-defined]
        return [tuple(row) for row in result] if result.returns_rows else []
    if kind == "async" or isinstance(tx, psycopg.AsyncConnection):
        raise TypeError(f"{type(tx).__name__} is asynchronous: use the *_async method")
    raise TypeError(f"tx must be {SYNC_KINDS}, not {type(tx).__name__}")


async def _execute_async(tx: object, statement: Statement, params: dict[str, Any]) -> list[Row]:
    if isinstance(tx, psycopg.AsyncConnection):
        async with tx.cursor(row_factory=tuple_row) as cur:
            await cur.execute(statement.query, params)
            return cast(list[Row], await cur.fetchall()) if _rows(cur.pgresult) else []
    kind = _sqlalchemy_kind(tx)
    if kind == "async":
        result = await tx.execute(statement.sqlalchemy, params)  # type: ignore[attr-defined]
        return [tuple(row) for row in result] if result.returns_rows else []
    if kind == "sync" or isinstance(tx, psycopg.Connection):
        raise TypeError(f"{type(tx).__name__} is synchronous: use the method without _async")
    raise TypeError(f"tx must be {ASYNC_KINDS}, not {type(tx).__name__}")


def run_sync(tx: object, plan: Plan[T]) -> T:
    """Drive ``plan`` on a synchronous transaction and return its result."""
    try:
        statement, params = next(plan)
        while True:
            rows = _execute_sync(tx, statement, params)
            statement, params = plan.send(rows)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def run_async(tx: object, plan: Plan[T]) -> T:
    """Drive ``plan`` on an asynchronous transaction and return its result."""
    try:
        statement, params = next(plan)
        while True:
            rows = await _execute_async(tx, statement, params)
            statement, params = plan.send(rows)
    except StopIteration as stop:
        result: T = stop.value
        return result
