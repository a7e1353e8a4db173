"""Start-up checks: can this dispatcher use its database at all?

Before ``outbox dispatch`` claims anything, :func:`check_database` makes sure
that it can connect (within ``db_connect_timeout``), that the schema is migrated
to the version this code needs, that its role holds every privilege the
dispatcher's statements need, and that it holds every key that seals a signing
secret in force, a client key or an endpoint's credentials
(:class:`SecretKeysMissing` otherwise). What is wrong is raised as one
:class:`~dispatchers.errors.DatabaseUnusable` whose one-line message says what
it is and what to do. Every failure to connect is final here, whatever
:mod:`dispatchers.store.sqlstates` says of it while running. The checks run in
one transaction, bounded by the dispatcher's own statement timeouts (set
locally, so a pooler in transaction mode is fine), and change nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

import psycopg
from psycopg.rows import BaseRowFactory, scalar_row, tuple_row

from dispatchers.errors import DatabaseUnreachable, DatabaseUnusable, DispatcherFailed
from dispatchers.store.postgres import TIMEOUT_PARAMS, timeout_values
from dispatchers.store.rows import MissingPrivilege, SchemaAccess, named_row
from dispatchers.store.settings import StoreSettings
from dispatchers.store.sqlstates import describe
from dispatchers.store.statements import store_queries
from outbox.internal import Statement, queries_for
from outbox.migrations import load_migrations
from outbox.roles import EXECUTES, PRIVILEGES

__all__ = ["SecretKeysMissing", "check_database"]

R = TypeVar("R")


class SecretKeysMissing(DispatcherFailed):
    """Signing secrets in force, client keys or endpoints' credentials are sealed
    under keys the dispatcher lacks."""


LIBPQ_SHORTEST_CONNECT_TIMEOUT = 2
"""libpq reads a ``connect_timeout`` below 2 seconds as 2 (and 0 as no bound)."""


def check_database(conninfo: str, config: StoreSettings) -> None:
    """Raise :class:`DatabaseUnusable` unless a dispatcher can work on ``conninfo``
    with ``config``: connected, migrated, and granted what it needs."""
    timeout = max(LIBPQ_SHORTEST_CONNECT_TIMEOUT, math.ceil(config.db_connect_timeout))
    try:
        conn = psycopg.connect(conninfo, connect_timeout=timeout)
    except psycopg.Error as exc:
        raise DatabaseUnreachable(f"cannot connect to the database: {describe(exc)}") from exc
    with conn:
        try:
            _check(conn, config)
        except psycopg.Error as exc:
            raise DatabaseUnusable(f"the start-up check failed: {describe(exc)}") from exc


def _check(conn: psycopg.Connection[Any], config: StoreSettings) -> None:
    """The checks, in the order that makes each one's answer meaningful: the
    schema before its tables, the version before the tables it brings."""
    schema = config.schema
    queries = store_queries(schema)
    migrate = f"run: outbox migrate --schema {schema}"
    bounds = timeout_values(config, config.statement_timeout)
    _rows(conn, queries["set_timeouts"], dict(zip(TIMEOUT_PARAMS, bounds, strict=True)), tuple_row)
    [access] = _rows(conn, queries["preflight_schema"], {"schema": schema}, named_row(SchemaAccess))
    role = access.role
    if not access.schema_exists:
        raise DatabaseUnusable(f'schema "{schema}" does not exist; {migrate}')
    if not access.usable:
        raise DatabaseUnusable(
            f'role "{role}" may not use schema "{schema}": grant it USAGE on the schema '
            "and the privileges a dispatcher needs"
        )
    if access.versions_readable is None:
        raise DatabaseUnusable(f'schema "{schema}" is not migrated; {migrate}')
    if not access.versions_readable:
        raise DatabaseUnusable(
            f'role "{role}" may not read {schema}.schema_migrations: grant it SELECT there'
        )
    applied = set(_rows(conn, queries_for(schema)["migrations_applied"], {}, scalar_row))
    needed = [m.version for m in load_migrations()]
    if not applied.issuperset(needed):
        current = max(applied, default=0)
        raise DatabaseUnusable(
            f'schema "{schema}" is at version {current}, and this dispatcher needs '
            f"version {needed[-1]}; {migrate}"
        )
    wanted = [
        (table, privilege)
        for table, grants in PRIVILEGES["dispatcher"].items()
        for privilege in grants
        if privilege != "USAGE"  # of a sequence: a dispatcher takes no id
    ]
    missing = _rows(
        conn,
        queries["preflight_privileges"],
        {
            "schema": schema,
            "tables": [table for table, _ in wanted],
            "privileges": [privilege for _, privilege in wanted],
            "functions": list(EXECUTES["dispatcher"]),
        },
        named_row(MissingPrivilege),
    )
    if missing:
        by_table: dict[str, list[str]] = {}
        for row in missing:
            by_table.setdefault(row.table_name, []).append(row.privilege)
        lacking = "; ".join(f"{', '.join(p)} on {t}" for t, p in by_table.items())
        raise DatabaseUnusable(
            f'role "{role}" lacks privileges in schema "{schema}": {lacking}; grant them to it'
        )
    in_use = _rows(conn, queries["preflight_secret_keys"], {}, scalar_row)
    missing_keys = config.keyring.missing(in_use) if config.keyring is not None else in_use
    if missing_keys:
        raise SecretKeysMissing(
            f"signing secrets, client keys or endpoint credentials are sealed under key(s) "
            f"{', '.join(missing_keys)}, which this "
            "dispatcher does not hold: configure every key in use (OUTBOX_SECRETS_KEY or "
            "--secrets-key-file)"
        )


def _rows(
    conn: psycopg.Connection[Any],
    statement: Statement,
    params: Mapping[str, Any],
    row: BaseRowFactory[R],
) -> list[R]:
    """The rows of ``statement``, made by ``row``."""
    with conn.cursor(row_factory=row) as cur:
        cur.execute(statement.query, params)
        return cur.fetchall()
