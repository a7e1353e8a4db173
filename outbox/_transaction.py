"""Running statements in the caller's transaction, whatever kind it is.

Write paths are *plans*: generators that yield ``(statement, params, row)`` and
receive the rows. :func:`run_sync` and :func:`run_async` drive a plan, so sync and
async share every query and decision. Nothing here commits, rolls back or opens a
connection. A Django connection is driven through its own cursor.

Design: docs/explanation/design/transactions.md
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.pq import ExecStatus
from psycopg.rows import RowFactory, kwargs_row, tuple_row

from outbox._queries import Statement
from outbox.errors import SchemaNotMigrated

if TYPE_CHECKING:
    from psycopg.pq.abc import PGresult

T = TypeVar("T")
RowMaker = Callable[..., Any]
"""Makes one row from its columns, given as keyword arguments named as in the result."""
Step = tuple[Statement, Mapping[str, Any], RowMaker | None]
Plan = Generator[Step, list[Any], T]

SYNC_KINDS = "a SQLAlchemy Session or Connection, a psycopg Connection, or a Django connection"
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


def _is_django(tx: object) -> bool:
    """Whether ``tx`` is a Django connection: ``django.db.connection`` (a proxy
    to the current thread's connection) or ``connections[alias]``.

    As with SQLAlchemy, Django is only looked at if the application imported it.
    """
    base = sys.modules.get("django.db.backends.base.base")
    proxy = sys.modules.get("django.utils.connection")
    return bool(
        (base and isinstance(tx, base.BaseDatabaseWrapper))
        or (proxy and isinstance(tx, proxy.ConnectionProxy))
    )


def _rows(result: PGresult | None) -> bool:
    """Whether a statement's result has rows to fetch. Cheaper than the cursor's
    ``description``, which builds a Column object per column."""
    return result is not None and result.status == TUPLES_OK


def scalar(*, notified: None = None, **column: Any) -> Any:
    """The row maker of a result with one value per row: that value.

    ``notified`` is the wake-up column that the ``_notify`` twin of a statement
    adds (see :mod:`outbox._queries`); it holds nothing.
    """
    (value,) = column.values()
    return value


def rows_plan(
    statement: Statement, params: Mapping[str, Any], row: Callable[..., T]
) -> Plan[list[T]]:
    """The plan of one statement: its rows, each made by ``row``."""
    rows: list[T] = yield statement, params, row
    return rows


def scalar_plan(statement: Statement, params: Mapping[str, Any]) -> Plan[int]:
    """The plan of one statement that counts: its one value."""
    values = yield from rows_plan(statement, params, scalar)
    return int(values[0])


def _factory(row: RowMaker | None) -> RowFactory[Any]:
    # rows of our making whatever row factory the application gave its connection
    return tuple_row if row is None else kwargs_row(row)


def _made(result: Any, row: RowMaker | None) -> list[Any]:
    """The rows of a SQLAlchemy result, made as psycopg's row factories make them."""
    if not result.returns_rows:
        return []
    if row is None:
        return [tuple(r) for r in result]
    return [row(**r._mapping) for r in result]


def _execute_sync(
    tx: object, statement: Statement, params: Mapping[str, Any], row: RowMaker | None
) -> list[Any]:
    if isinstance(tx, psycopg.Connection):
        with tx.cursor(row_factory=_factory(row)) as cur:
            cur.execute(statement.query, params)
            return cur.fetchall() if _rows(cur.pgresult) else []
    if _is_django(tx):
        return _execute_django(tx, statement, params, row)
    kind = _sqlalchemy_kind(tx)
    if kind == "sync":
        result = tx.execute(statement.sqlalchemy, params)  # type: ignore[attr-defined]
        return _made(result, row)
    if kind == "async" or isinstance(tx, psycopg.AsyncConnection):
        raise TypeError(f"{type(tx).__name__} is asynchronous: use the *_async method")
    raise TypeError(f"tx must be {SYNC_KINDS}, not {type(tx).__name__}")


def _execute_django(
    tx: Any, statement: Statement, params: Mapping[str, Any], row: RowMaker | None
) -> list[Any]:
    """Run ``statement`` through a cursor of Django connection ``tx``, the rows
    made as on a psycopg connection (Django's cursor wraps a psycopg one)."""
    if tx.vendor != "postgresql":
        raise TypeError(f"tx is a Django connection to {tx.vendor}, not to PostgreSQL")
    with tx.cursor() as cur:
        # Django's backend runs on psycopg 3 whenever it is installed, as it is
        # here: the cursor it wraps is psycopg's, and takes our row factory
        cur.cursor.row_factory = _factory(row)
        cur.execute(statement.query, params)
        return cur.fetchall() if _rows(cur.pgresult) else []


async def _execute_async(
    tx: object, statement: Statement, params: Mapping[str, Any], row: RowMaker | None
) -> list[Any]:
    if isinstance(tx, psycopg.AsyncConnection):
        async with tx.cursor(row_factory=_factory(row)) as cur:
            await cur.execute(statement.query, params)
            return await cur.fetchall() if _rows(cur.pgresult) else []
    kind = _sqlalchemy_kind(tx)
    if kind == "async":
        result = await tx.execute(statement.sqlalchemy, params)  # type: ignore[attr-defined]
        return _made(result, row)
    if kind == "sync" or isinstance(tx, psycopg.Connection):
        raise TypeError(f"{type(tx).__name__} is synchronous: use the method without _async")
    if _is_django(tx):
        raise TypeError(
            "Django's connections are synchronous: run the transaction in a function "
            "wrapped with asgiref's sync_to_async and use the method without _async"
        )
    raise TypeError(f"tx must be {ASYNC_KINDS}, not {type(tx).__name__}")


_MISSING = frozenset({"42P01", "3F000"})  # undefined_table, invalid_schema_name
# undefined_column, undefined_function: our statements name only columns and
# functions we created
_BEHIND = frozenset({"42703", "42883"})


def _driver_error(exc: BaseException) -> BaseException:
    """The driver's error behind ``exc``: psycopg's own, SQLAlchemy's ``orig``, or
    the error Django raised its own from (else ``exc`` itself)."""
    driver = getattr(exc, "orig", None)
    django = sys.modules.get("django.db.utils")
    if django and isinstance(exc, django.Error):
        driver = exc.__cause__
    return driver if isinstance(driver, BaseException) else exc


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a database error raised by psycopg, or through SQLAlchemy
    (which keeps the driver's error as ``orig``) or Django (which raises its own
    error from the driver's); None for any other error."""
    code = getattr(_driver_error(exc), "sqlstate", None)
    return code if isinstance(code, str) else None


@contextlib.contextmanager
def schema_required(schema: str) -> Iterator[None]:
    """Raise :class:`SchemaNotMigrated` for an error of the block that says the
    schema or its tables do not exist, or lack a column that a later migration
    adds (by :func:`sqlstate`)."""
    try:
        yield
    except Exception as exc:
        code = sqlstate(exc)
        if code in _MISSING or code in _BEHIND:
            # chained to the driver's own error, not to SQLAlchemy's, whose text
            # lists the statement's parameters (a message's body) for any error
            # log to print
            raise SchemaNotMigrated(schema, behind=code in _BEHIND) from _driver_error(exc)
        raise


def run_sync(tx: object, plan: Plan[T], *, schema: str | None = None) -> T:
    """Drive ``plan`` on a synchronous transaction and return its result; with
    ``schema``, a missing table or column is :class:`SchemaNotMigrated`."""
    with schema_required(schema) if schema is not None else contextlib.nullcontext():
        try:
            step = next(plan)
            while True:
                step = plan.send(_execute_sync(tx, *step))
        except StopIteration as stop:
            result: T = stop.value
            return result


async def run_async(tx: object, plan: Plan[T]) -> T:
    """Drive ``plan`` on an asynchronous transaction and return its result."""
    try:
        step = next(plan)
        while True:
            step = plan.send(await _execute_async(tx, *step))
    except StopIteration as stop:
        result: T = stop.value
        return result
