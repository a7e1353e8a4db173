"""Shared fixtures: one PostgreSQL per test session, a migrated template, a fresh
database per test.

The server is the embedded one (in a temporary directory) unless
``OUTBOX_TEST_DATABASE_URL`` names an external server; tests then create and drop
their own databases on it.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from dispatchers.embedded import EmbeddedPostgres
from outbox.dsn import with_database
from outbox.migrations import migrate
from tests.transactions import KINDS, Tx, open_tx

pytest_plugins = ["tests.tracing"]  # exporter, provider: spans recorded in memory

TEMPLATE = "outbox_test_template"
_counter = itertools.count()


@dataclass
class PgServer:
    """The test session's server: its admin URL and, if embedded, its handle."""

    url: str
    embedded: EmbeddedPostgres | None

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.url, autocommit=True)

    def create_database(self, name: str, *, template: str | None = None) -> str:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
            if template:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                        sql.Identifier(name), sql.Identifier(template)
                    )
                )
            else:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return with_database(self.url, name)

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    external = os.environ.get("OUTBOX_TEST_DATABASE_URL")
    if external:
        yield PgServer(external, None)
        return
    with tempfile.TemporaryDirectory(prefix="outbox-test-") as tmp:
        server = EmbeddedPostgres(os.path.join(tmp, "pg"), delete=True)
        try:
            _throwaway(server.url)
            yield PgServer(server.url, server)
        finally:
            server.cleanup()


def _throwaway(url: str) -> None:
    """Trade durability, which a session's throwaway server never needs, for speed:
    every test creates and drops a database, and each of those waits on fsync."""
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = off").format(sql.Identifier(setting)))
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def template_url(pg_server: PgServer) -> Iterator[str]:
    """A database with the schema migrated, cloned by every test's database."""
    name = f"{TEMPLATE}_{os.getpid()}"
    url = pg_server.create_database(name)
    migrate(url, schema="outbox")
    yield url
    pg_server.drop_database(name)


@pytest.fixture
def database_url(pg_server: PgServer, template_url: str) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    template = f"{TEMPLATE}_{os.getpid()}"
    name = f"outbox_test_{os.getpid()}_{next(_counter)}"
    url = pg_server.create_database(name, template=template)
    yield url
    pg_server.drop_database(name)


@pytest.fixture
def empty_database_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh database with no schema at all (for migration tests)."""
    name = f"outbox_empty_{os.getpid()}_{next(_counter)}"
    url = pg_server.create_database(name)
    yield url
    pg_server.drop_database(name)


@pytest.fixture(params=KINDS)
async def tx(request: pytest.FixtureRequest, database_url: str) -> AsyncIterator[Tx]:
    """Each test that takes ``tx`` runs once per transaction kind."""
    async with AsyncExitStack() as stack:
        yield await open_tx(request.param, database_url, stack)
