"""Every privilege on every column of the live schema, tried as each role.

``outbox roles --apply`` grants what :data:`outbox.roles.PRIVILEGES` says; then,
connected as the producer, the dispatcher and the operator, each privilege is
tried on each column of each table, as the migrations left the schema: what
the table grants works, everything else is refused with SQLSTATE 42501
(insufficient_privilege). The columns come from the server's catalog, so a
column or table that a migration adds without a decision in
:data:`outbox.roles.TABLES` fails here.

Each try touches no row: ``WHERE false`` (or an empty ``SELECT``) still has its
privileges checked when the statement starts.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from outbox.roles import ROLES, SEQUENCES, TABLES, holds
from tests.conftest import PgServer
from tests.schema.test_roles import Roles, grant_all, made_roles

SCHEMA = "outbox"

LIVE_COLUMNS = """
    SELECT c.relname, a.attname
    FROM pg_catalog.pg_attribute AS a
    JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
      AND NOT c.relispartition
      AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY c.relname, a.attnum
"""

LIVE_PARTITIONS = """
    SELECT c.relname
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relispartition AND c.relkind IN ('r', 'p')
    ORDER BY c.relname
"""

LIVE_SEQUENCES = """
    SELECT c.relname
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relkind = 'S'
    ORDER BY c.relname
"""

# One statement per privilege that names one column (or none, for DELETE) and
# touches no row. INSERT overrides an identity column's generation so that its
# own column can be named; UPDATE sets DEFAULT so that it reads no column.
PROBES = {
    "SELECT": "SELECT {column} FROM {table} WHERE false",
    "INSERT": "INSERT INTO {table} ({column}) OVERRIDING SYSTEM VALUE SELECT NULL WHERE false",
    "UPDATE": "UPDATE {table} SET {column} = DEFAULT WHERE false",
}


def live_columns(url: str) -> dict[str, tuple[str, ...]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(LIVE_COLUMNS, {"schema": SCHEMA}).fetchall()
    columns: dict[str, list[str]] = {}
    for table, column in rows:
        columns.setdefault(table, []).append(column)
    return {table: tuple(names) for table, names in columns.items()}


def allowed(conn: psycopg.Connection[tuple[object, ...]], statement: sql.Composed) -> bool:
    """Run ``statement`` in a transaction that is rolled back: True if it ran, False
    if it was refused for want of a privilege; any other error is the test's."""
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(statement)
    except psycopg.errors.InsufficientPrivilege as refused:
        assert refused.sqlstate == "42501"
        return False
    return True


@pytest.fixture
def roles(pg_server: PgServer, database_url: str) -> Iterator[Roles]:
    with made_roles(pg_server, database_url) as made:
        yield made


def test_every_table_column_and_sequence_of_the_schema_has_its_privileges_decided(
    database_url: str,
) -> None:
    """A migration that adds a table, a column or a sequence adds it to
    outbox.roles (TABLES, SEQUENCES) too, having decided who may use it."""
    assert live_columns(database_url) == dict(sorted(TABLES.items()))
    with psycopg.connect(database_url) as conn:
        sequences = [name for (name,) in conn.execute(LIVE_SEQUENCES, {"schema": SCHEMA})]
    assert sequences == sorted(SEQUENCES)


@pytest.mark.parametrize("kind", ROLES)
def test_each_role_holds_on_each_column_exactly_the_privileges_of_its_table(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    grant_all(database_url, roles, capsys)
    wrong: list[tuple[str, str | None, str, str]] = []
    with psycopg.connect(roles.urls[kind], autocommit=True) as conn:
        for table, columns in live_columns(database_url).items():
            target = sql.Identifier(SCHEMA, table)
            for column in columns:
                for privilege, probe in PROBES.items():
                    statement = sql.SQL(probe).format(table=target, column=sql.Identifier(column))
                    expected = holds(kind, table, privilege, column)
                    if allowed(conn, statement) is not expected:
                        wrong.append(
                            (table, column, privilege, "granted" if expected else "denied")
                        )
            delete = sql.SQL("DELETE FROM {} WHERE false").format(target)
            expected = holds(kind, table, "DELETE")
            if allowed(conn, delete) is not expected:
                wrong.append((table, None, "DELETE", "granted" if expected else "denied"))
            # granted to no role: emptying a table, triggers, foreign keys to it
            if allowed(conn, sql.SQL("TRUNCATE {}").format(target)):
                wrong.append((table, None, "TRUNCATE", "denied"))
    with psycopg.connect(database_url) as conn:
        for table in TABLES:
            row = conn.execute(
                "SELECT has_any_column_privilege(%(role)s, %(table)s, 'REFERENCES'),"
                " has_table_privilege(%(role)s, %(table)s, 'TRIGGER')",
                {"role": roles.names[kind], "table": f"{SCHEMA}.{table}"},
            ).fetchone()
            if row != (False, False):
                wrong.append((table, None, "REFERENCES or TRIGGER", "denied"))
    # (table, column, privilege, what outbox.roles.PRIVILEGES says) for each try
    # that did not do what the table says
    assert wrong == []


def test_each_role_takes_ids_from_exactly_its_sequences_and_creates_nothing(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    grant_all(database_url, roles, capsys)
    wrong = []
    for kind in ROLES:
        with psycopg.connect(roles.urls[kind], autocommit=True) as conn:
            for sequence in SEQUENCES:
                name = sql.Literal(f"{SCHEMA}.{sequence}")
                taken = allowed(conn, sql.SQL("SELECT nextval({})").format(name))
                if taken is not holds(kind, sequence, "USAGE"):
                    wrong.append((kind, "USAGE", sequence))
                read = sql.SQL("SELECT last_value FROM {}").format(sql.Identifier(SCHEMA, sequence))
                if allowed(conn, read):
                    wrong.append((kind, "SELECT", sequence))
                if allowed(conn, sql.SQL("SELECT setval({}, 1000000)").format(name)):
                    wrong.append((kind, "UPDATE", sequence))
            create = sql.SQL("CREATE TABLE {} (id int)").format(sql.Identifier(SCHEMA, "sneaky"))
            if allowed(conn, create):
                wrong.append((kind, "CREATE", SCHEMA))
    assert wrong == []


def test_partitions_of_the_history_are_reached_through_their_parents_only(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str]
) -> None:
    """delivered and attempts are partitioned (migration 0032): a statement through
    the parent is checked against the parent's privileges alone, so no role holds
    any on a partition, and none reads or changes one by its own name."""
    grant_all(database_url, roles, capsys)
    with psycopg.connect(database_url) as conn:
        partitions = [name for (name,) in conn.execute(LIVE_PARTITIONS, {"schema": SCHEMA})]
    assert {"delivered_default", "attempts_default"} <= set(partitions)
    wrong = []
    for kind in ROLES:
        with psycopg.connect(roles.urls[kind], autocommit=True) as conn:
            for partition in partitions:
                target = sql.Identifier(SCHEMA, partition)
                for probe in ("SELECT 1 FROM {} WHERE false", "DELETE FROM {} WHERE false"):
                    if allowed(conn, sql.SQL(probe).format(target)):
                        wrong.append((kind, partition, probe.split()[0]))
    assert wrong == []
