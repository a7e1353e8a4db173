"""Apply the numbered SQL files of ``sql/migrations/`` to a schema, in order, exactly once.

Each migration runs in its own transaction, under a transaction-scoped advisory
lock (safe behind PgBouncer in transaction mode), with ``search_path`` set to the
target schema so the files themselves name no schema. Applied versions are
recorded with a checksum; a file changed after it was applied is an error.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from outbox.errors import MigrationError
from outbox.queries import check_schema_name, sql_dir

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str = field(repr=False)

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """Every migration file, by version; refuses gaps, duplicates and stray names."""
    directory = directory or sql_dir() / "migrations"
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_name.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text("utf-8")))
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise MigrationError(
                f"migration {migration.version:04d} follows {expected - 1:04d}: versions "
                "must be numbered 0001, 0002, ... without gaps"
            )
    return found


def _lock_key(schema: str) -> int:
    digest = hashlib.sha256(f"outbox.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def migrate(
    conninfo: str,
    *,
    schema: str = "outbox",
    migrations: list[Migration] | None = None,
    on_apply: Callable[[Migration], None] | None = None,
) -> list[Migration]:
    """Apply pending migrations to ``schema``; return those applied by this call.

    Safe to run twice in a row and from several processes at once: each step
    takes the same advisory lock and re-reads what is applied.
    """
    check_schema_name(schema)
    migrations = load_migrations() if migrations is None else migrations
    ident = sql.Identifier(schema)
    table = sql.SQL("{}.schema_migrations").format(ident)
    applied_now: list[Migration] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for migration in migrations:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '60s'")
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(schema),))
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} ("
                        " version integer PRIMARY KEY,"
                        " name text NOT NULL,"
                        " checksum text NOT NULL,"
                        " applied_at timestamptz NOT NULL DEFAULT now())"
                    ).format(table)
                )
                row = conn.execute(
                    sql.SQL("SELECT checksum FROM {} WHERE version = %s").format(table),
                    (migration.version,),
                ).fetchone()
                if row is not None:
                    if row[0] != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} was changed "
                            "after it was applied; add a new migration instead"
                        )
                    continue
                conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(ident))
                try:
                    conn.execute(migration.sql.encode("utf-8"))
                except psycopg.Error as exc:
                    raise MigrationError(
                        f"migration {migration.version:04d}_{migration.name} failed: {exc}"
                    ) from exc
                conn.execute(
                    sql.SQL("INSERT INTO {} (version, name, checksum) VALUES (%s, %s, %s)").format(
                        table
                    ),
                    (migration.version, migration.name, migration.checksum),
                )
            applied_now.append(migration)
            if on_apply is not None:
                on_apply(migration)
    return applied_now


def applied_versions(conninfo: str, *, schema: str = "outbox") -> list[int]:
    """Versions recorded as applied in ``schema`` (empty if never migrated)."""
    check_schema_name(schema)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT to_regclass(format('%%I.schema_migrations', %s::text)) IS NOT NULL",
            (schema,),
        ).fetchone()
        if not exists or not exists[0]:
            return []
        rows = conn.execute(
            sql.SQL("SELECT version FROM {}.schema_migrations ORDER BY version").format(
                sql.Identifier(schema)
            )
        ).fetchall()
        return [int(r[0]) for r in rows]
