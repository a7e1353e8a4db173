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
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import scalar_row

from outbox._queries import queries_for, sql_dir
from outbox.defaults import DEFAULT_SCHEMA
from outbox.errors import MigrationError

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
    schema: str = DEFAULT_SCHEMA,
    migrations: list[Migration] | None = None,
    on_apply: Callable[[Migration], None] | None = None,
) -> list[Migration]:
    """Apply pending migrations to ``schema``; return those applied by this call.

    Safe to run twice in a row and from several processes at once: each step
    takes the same advisory lock and re-reads what is applied.
    """
    queries = queries_for(schema)
    migrations = load_migrations() if migrations is None else migrations
    applied_now: list[Migration] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:

        def run(statement: str, /, **params: Any) -> Any:
            """Run ``statement``; return its one value, or None if it has no row."""
            with conn.cursor(row_factory=scalar_row) as cur:
                cur.execute(queries[statement].query, params)
                return cur.fetchone() if cur.description else None

        for migration in migrations:
            with conn.transaction():
                run("migrate_lock_timeout")
                run("migrate_lock", key=_lock_key(schema))
                if not run("schema_exists", schema=schema):
                    run("schema_create")
                run("migrations_create")
                checksum = run("migration_checksum", version=migration.version)
                if checksum is not None:
                    if checksum != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} was changed "
                            "after it was applied; add a new migration instead"
                        )
                    continue
                run("migrate_search_path")
                try:
                    conn.execute(migration.sql.encode("utf-8"))
                except psycopg.Error as exc:
                    raise MigrationError(
                        f"migration {migration.version:04d}_{migration.name} failed: {exc}"
                    ) from exc
                run(
                    "migration_record",
                    version=migration.version,
                    name=migration.name,
                    checksum=migration.checksum,
                )
            applied_now.append(migration)
            if on_apply is not None:
                on_apply(migration)
    return applied_now


def applied_versions(conninfo: str, *, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Versions recorded as applied in ``schema`` (empty if never migrated)."""
    queries = queries_for(schema)
    table = sql.Identifier(schema, "schema_migrations").as_string(None)
    with (
        psycopg.connect(conninfo, autocommit=True) as conn,
        conn.cursor(row_factory=scalar_row) as cur,
    ):
        if not cur.execute(queries["table_exists"].query, {"table": table}).fetchone():
            return []
        return list(cur.execute(queries["migrations_applied"].query).fetchall())
