"""What the web surfaces read: the management API, the dashboard and the
consumer portal, through one catalog (``sql/``, one file per resource, loaded by
:func:`dispatchers.store.statements.web_queries`) and typed functions, one
module per resource: :mod:`~dispatchers.store.web.endpoints`,
:mod:`~dispatchers.store.web.messages`, :mod:`~dispatchers.store.web.attempts`,
:mod:`~dispatchers.store.web.activity` (the operator's overview) and
:mod:`~dispatchers.store.web.tokens` (the API's own tables).

Invariants:

- A surface never names a statement: it calls these functions, each of which
  returns typed rows, one row class per resource whatever surface shows it.
- Tenant scoping is one parameter, ``tenant_id``: None is the operator (every
  row), a tenant's row id keeps to that tenant's rows, applied inside the SQL.
  A row of another tenant reads as a missing one. The portal and a tenant's API
  token call the same functions with the same scope, and see the same fields.
- Every function takes a connection in a transaction of the caller's (a
  surface's read-only one for pages) and the schema; none commits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import psycopg

from dispatchers.store.statements import web_queries
from outbox.internal import rows_plan, run_sync

T = TypeVar("T")

Conn = psycopg.Connection[Any]


def rows(
    conn: Conn, schema: str, name: str, params: Mapping[str, Any], row: Callable[..., T]
) -> list[T]:
    """The rows of the web statement ``name``, each made by ``row`` (a missing
    table or column is :class:`~outbox.errors.SchemaNotMigrated`)."""
    return run_sync(conn, rows_plan(web_queries(schema)[name], params, row), schema=schema)
