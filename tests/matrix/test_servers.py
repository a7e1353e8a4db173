"""The server matrix: the outbox on every PostgreSQL the suite can run, as a user
on a managed service runs it.

Each test runs on the embedded server and on each stock server (PostgreSQL 14 to
17, see ``tests/servers.py``; one that is not installed skips, saying how to
install it), whatever ``OUTBOX_TEST_SERVERS`` says. The stock servers listen on
127.0.0.1 and set a managed service's timeouts server-side (statement 30 s, lock
10 s, idle in transaction 60 s); Debian's PostgreSQL 15 has JIT on.

The database belongs to the superuser, as a managed service's does, and PUBLIC
keeps no privilege on it (nor CREATE on schema public, which PostgreSQL 14 still
grants). The outbox's role is not a superuser, creates no database and no role,
and owns only its schema, which was created for it (``CREATE SCHEMA outbox
AUTHORIZATION role``); on the database it has CONNECT, nothing more: migrating
asks whether the schema exists before it would create it (PostgreSQL checks the
privilege to create a schema before IF NOT EXISTS).
"""

from __future__ import annotations

import collections
import itertools
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from outbox.receiver import Inbox
from tests.conftest import PgServer
from tests.processes import Fleet, enqueue_many, query, structured_key
from tests.receiver import Receiver
from tests.servers import MANAGED

pytestmark = pytest.mark.every_server

TOTAL = 200
_counter = itertools.count()


def as_role(url: str, role: str, password: str) -> str:
    """``url`` with another user and password (the host, database and options kept)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(role)}:{quote(password)}@{host}"))


@dataclass(frozen=True)
class Role:
    name: str
    url: str
    """The test database, as this role."""


@dataclass
class Schema:
    """The test database (owned by the superuser) and the role that owns its outbox
    schema and nothing else."""

    pg_server: PgServer
    admin_url: str
    """The database, as the superuser."""
    database: str
    roles: list[Role] = field(default_factory=list)

    @property
    def owner(self) -> Role:
        return self.roles[0]

    def role(self, kind: str) -> Role:
        """A new LOGIN role with CONNECT on the database and nothing else."""
        name = f"outbox_matrix_{kind}_{os.getpid()}_{next(_counter)}"
        password = secrets.token_hex(16)
        with self.pg_server.admin() as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(name), sql.Literal(password)
                )
            )
            admin.execute(
                sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                    sql.Identifier(self.database), sql.Identifier(name)
                )
            )
        role = Role(name, as_role(self.admin_url, name, password))
        self.roles.append(role)
        return role


@pytest.fixture
def schema(pg_server: PgServer, empty_database_url: str) -> Iterator[Schema]:
    database = urlsplit(empty_database_url).path.lstrip("/")
    made = Schema(pg_server, empty_database_url, database)
    try:
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(database))
            )
            conn.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
            owner = made.role("owner")
            conn.execute(
                sql.SQL("CREATE SCHEMA outbox AUTHORIZATION {}").format(sql.Identifier(owner.name))
            )
        yield made
    finally:
        if made.roles:
            everyone = sql.SQL(", ").join(sql.Identifier(role.name) for role in made.roles)
            with psycopg.connect(empty_database_url, autocommit=True) as conn:
                # what they own here, and their grants on the database
                conn.execute(sql.SQL("DROP OWNED BY {}").format(everyone))
            with pg_server.admin() as admin:
                admin.execute(sql.SQL("DROP ROLE {}").format(everyone))


def run_outbox(*argv: str, url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``outbox ...`` against ``url`` in a child process."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OUTBOX_DATABASE_URL", "DATABASE_URL", "OUTBOX_EMBEDDED_DIR")
    }
    return subprocess.run(
        [sys.executable, "-m", "dispatchers.cli", *argv, "--database-url", url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
        check=False,
    )


def outbox(*argv: str, url: str, cwd: Path) -> str:
    """Run ``outbox ...`` against ``url`` in a child process, which must exit 0;
    its stdout."""
    done = run_outbox(*argv, url=url, cwd=cwd)
    assert done.returncode == 0, f"outbox {' '.join(argv)}: exit {done.returncode}\n{done.stderr}"
    return done.stdout


def check_role(schema: Schema, role: Role) -> None:
    """The role is no superuser, creates no database nor role, may create in no
    schema but its own and no schema in the database, and its sessions get the
    server's timeouts."""
    with psycopg.connect(role.url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT r.rolsuper, r.rolcreatedb, r.rolcreaterole,"
            " has_database_privilege(current_database(), 'CREATE'),"
            " has_schema_privilege('public', 'CREATE')"
            " FROM pg_roles AS r WHERE r.rolname = current_user"
        ).fetchone()
        assert row == (False, False, False, False, False)
        if schema.pg_server.stock is not None:
            settings = {name: conn.execute(f"SHOW {name}").fetchone() for name in MANAGED}
            assert settings == {
                "statement_timeout": ("30s",),
                "idle_in_transaction_session_timeout": ("1min",),
                "lock_timeout": ("10s",),
                "track_commit_timestamp": ("off",),
            }


def deliver(schema: Schema, producer: Role, dispatcher: Role, tmp_path: Path) -> None:
    """Enqueue :data:`TOTAL` messages as ``producer``, drain them with ``outbox
    dispatch`` as ``dispatcher``, and check each was delivered once."""
    keys = [f"matrix-{i:03d}" for i in range(TOTAL)]
    with Receiver() as receiver, Fleet(tmp_path) as fleet:
        ids = enqueue_many(producer.url, f"{receiver.url}/hook", keys)
        assert len(set(ids)) == TOTAL
        proc = fleet.start(dispatcher.url, "--drain", "--concurrency", "16")
        assert proc.wait(timeout=90) == 0, proc.describe()
        with receiver.lock:
            requests = list(receiver.requests)
    seen = collections.Counter(r.headers.get("idempotency-key") for r in requests)
    assert seen == {structured_key(key): 1 for key in keys}
    admin = schema.admin_url
    assert query(admin, "SELECT count(*) FROM outbox.messages") == [(0,)]
    delivered = query(admin, "SELECT id, attempts, last_status FROM outbox.delivered ORDER BY id")
    assert delivered == [(i, 1, 200) for i in sorted(ids)]


def test_a_role_that_owns_only_its_schema_migrates_enqueues_and_dispatches(
    schema: Schema, tmp_path: Path
) -> None:
    check_role(schema, schema.owner)
    outbox("migrate", url=schema.owner.url, cwd=tmp_path)
    owner = query(
        schema.admin_url,
        "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'outbox'",
    )
    assert owner == [(schema.owner.name,)]
    deliver(schema, schema.owner, schema.owner, tmp_path)
    # the receiver's inbox, in the schema the role owns: no CREATE on the database
    # for that either
    with psycopg.connect(schema.owner.url) as conn:
        inbox = Inbox(schema="outbox")
        inbox.ensure_schema(conn)
        assert inbox.claim(conn, "key-1") and not inbox.claim(conn, "key-1")


def test_least_privilege_roles_enqueue_and_dispatch(schema: Schema, tmp_path: Path) -> None:
    """The owner migrates and grants (``outbox roles --apply``); a producer that may
    only enqueue does, a dispatcher that may only deliver drains. Neither has more
    than CONNECT on the database."""
    outbox("migrate", url=schema.owner.url, cwd=tmp_path)
    producer, dispatcher = schema.role("producer"), schema.role("dispatcher")
    outbox(
        "roles",
        "--producer",
        producer.name,
        "--dispatcher",
        dispatcher.name,
        "--apply",
        url=schema.owner.url,
        cwd=tmp_path,
    )
    check_role(schema, producer)
    check_role(schema, dispatcher)
    deliver(schema, producer, dispatcher, tmp_path)
