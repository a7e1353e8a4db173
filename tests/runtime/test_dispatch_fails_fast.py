"""A dispatcher fails fast on what cannot heal, and retries what can.

At start-up, ``outbox dispatch --drain`` (a real process) exits 1 with one line on
stderr against an unreachable database, a role the server refuses, a schema that
is not migrated (or not to this version) and a role without the privileges it
needs. Running, a permanent error (a privilege revoked) that persists for a lease
stops the dispatcher, having given back what it held; connections terminated
again and again (a transient error) do not, and a drain stopped while the
database fails does not exit 0.

The embedded test server trusts every local connection, so no password can be
wrong on it: a role that does not exist stands for a refused login. The server
refuses both at login, and libpq reports both as a failure to connect (without a
SQLSTATE), which the start-up check treats alike.
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from dispatchers.errors import DatabaseUnusable
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog
from outbox.migrations import load_migrations
from tests.database import Db
from tests.dispatching import fast_config
from tests.processes import DispatcherProcess, Fleet, enqueue_many, query, wait_until
from tests.receiver import Received, Receiver, Reply

FAILS_WITHIN = 15.0
"""Seconds from start to exit for each start-up failure."""

GRANTS = (
    "GRANT USAGE ON SCHEMA outbox TO {role}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox TO {role}",
    "GRANT EXECUTE ON FUNCTION outbox.alert_lag, outbox.alert_unknown_key, outbox.expire_payloads,"
    " outbox.history_partitions, outbox.history_extend, outbox.history_drop,"
    " outbox.key_generation_turn, outbox.key_generation_carry TO {role}",
)
"""Everything a dispatcher role could need in the outbox schema, and more."""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as fleet:
        yield fleet


@pytest.fixture
def role(database_url: str) -> Iterator[str]:
    """A role that may log in to the test's database and holds nothing else."""
    name = f"outbox_dispatcher_{os.getpid()}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def as_role(url: str, role: str) -> str:
    """``url`` with ``role`` as its user, and no password."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


def grant(url: str, role: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(role=sql.Identifier(role)))


def failed_fast(proc: DispatcherProcess) -> str:
    """The one line ``proc`` printed on stderr, having exited 1 in time."""
    assert proc.wait(timeout=FAILS_WITHIN) == 1, proc.describe()
    lines = proc.stderr().splitlines()
    assert len(lines) == 1, proc.describe()
    assert lines[0].startswith("outbox dispatch: "), lines
    return lines[0]


# -- at start-up ---------------------------------------------------------------------


@pytest.mark.slow
def test_an_unreachable_database_fails_at_once(fleet: Fleet) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = fleet.start(f"postgresql://outbox@127.0.0.1:{port}/outbox", "--drain")
    line = failed_fast(proc)
    assert line.startswith("outbox dispatch: cannot connect to the database: "), line
    assert f"port {port}" in line


def test_a_role_the_server_refuses_fails_at_once(database_url: str, fleet: Fleet) -> None:
    proc = fleet.start(as_role(database_url, "outbox_no_such_role"), "--drain")
    line = failed_fast(proc)
    assert line.startswith("outbox dispatch: cannot connect to the database: "), line
    assert '"outbox_no_such_role"' in line


def test_a_schema_that_does_not_exist_fails_naming_the_migration(
    database_url: str, fleet: Fleet
) -> None:
    proc = fleet.start(database_url, "--drain", "--schema", "never_migrated")
    assert failed_fast(proc) == (
        'outbox dispatch: schema "never_migrated" does not exist; '
        "run: outbox migrate --schema never_migrated"
    )


def test_a_schema_without_migrations_fails_naming_the_migration(
    database_url: str, fleet: Fleet
) -> None:
    query(database_url, "CREATE SCHEMA bare")
    proc = fleet.start(database_url, "--drain", "--schema", "bare")
    assert failed_fast(proc) == (
        'outbox dispatch: schema "bare" is not migrated; run: outbox migrate --schema bare'
    )


@pytest.mark.slow
def test_a_schema_behind_this_version_fails_naming_both_versions(
    database_url: str, fleet: Fleet
) -> None:
    latest = load_migrations()[-1].version
    query(database_url, "DELETE FROM outbox.schema_migrations WHERE version = %s", (latest,))
    proc = fleet.start(database_url, "--drain")
    assert failed_fast(proc) == (
        f'outbox dispatch: schema "outbox" is at version {latest - 1}, and this dispatcher '
        f"needs version {latest}; run: outbox migrate --schema outbox"
    )


@pytest.mark.slow
def test_a_role_without_usage_on_the_schema_fails_at_once(
    database_url: str, role: str, fleet: Fleet
) -> None:
    proc = fleet.start(as_role(database_url, role), "--drain")
    assert failed_fast(proc) == (
        f'outbox dispatch: role "{role}" may not use schema "outbox": grant it USAGE on '
        "the schema and the privileges a dispatcher needs"
    )


def test_a_role_lacking_table_privileges_fails_naming_them(
    database_url: str, role: str, fleet: Fleet
) -> None:
    grant(database_url, role, *GRANTS)
    grant(
        database_url,
        role,
        "REVOKE DELETE ON outbox.messages FROM {role}",
        "REVOKE INSERT, UPDATE ON outbox.delivered FROM {role}",
    )
    proc = fleet.start(as_role(database_url, role), "--drain")
    assert failed_fast(proc) == (
        f'outbox dispatch: role "{role}" lacks privileges in schema "outbox": '
        "DELETE on messages; INSERT, UPDATE on delivered; grant them to it"
    )


@pytest.mark.parametrize(
    ("table", "privileges"),
    [
        # the list of a slot's waiting requests (migration 0021), which a list of the
        # dispatcher's privileges kept beside outbox.roles once missed
        ("unseated_requests", "SELECT, UPDATE, DELETE"),
        ("destination_health", "SELECT, INSERT, UPDATE, DELETE"),
    ],
)
def test_every_table_the_dispatcher_writes_is_checked_at_start_up(
    database_url: str, role: str, fleet: Fleet, table: str, privileges: str
) -> None:
    grant(database_url, role, *GRANTS, f"REVOKE ALL ON outbox.{table} FROM {{role}}")
    proc = fleet.start(as_role(database_url, role), "--drain")
    assert failed_fast(proc) == (
        f'outbox dispatch: role "{role}" lacks privileges in schema "outbox": '
        f"{privileges} on {table}; grant them to it"
    )


def test_a_role_that_may_not_raise_the_dispatchers_alerts_fails_naming_the_functions(
    database_url: str, role: str, fleet: Fleet
) -> None:
    grant(database_url, role, *GRANTS, "REVOKE EXECUTE ON FUNCTION outbox.alert_lag FROM {role}")
    proc = fleet.start(as_role(database_url, role), "--drain")
    assert failed_fast(proc) == (
        f'outbox dispatch: role "{role}" lacks privileges in schema "outbox": '
        "EXECUTE on alert_lag; grant them to it"
    )


def test_a_role_that_may_not_read_the_versions_fails_naming_the_table(
    database_url: str, role: str, fleet: Fleet
) -> None:
    grant(database_url, role, *GRANTS, "REVOKE SELECT ON outbox.schema_migrations FROM {role}")
    proc = fleet.start(as_role(database_url, role), "--drain")
    assert failed_fast(proc) == (
        f'outbox dispatch: role "{role}" may not read outbox.schema_migrations: '
        "grant it SELECT there"
    )


@pytest.mark.slow
def test_a_role_with_every_privilege_drains(
    database_url: str, role: str, fleet: Fleet, receiver: Receiver
) -> None:
    grant(database_url, role, *GRANTS)
    enqueue_many(database_url, receiver.url, ["granted-1", "granted-2"])
    proc = fleet.start(as_role(database_url, role), "--drain")
    assert proc.wait(timeout=30) == 0, proc.describe()
    assert len(receiver.requests) == 2


# -- while running -------------------------------------------------------------------


class Timed(EventLog):
    """Keeps every event with the monotonic time it was logged."""

    def __init__(self) -> None:
        super().__init__(stream=io.StringIO(), format="json", level="debug")
        self.events: list[dict[str, Any]] = []

    def event(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, "at": time.monotonic(), **fields})

    def named(self, event: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event]


def holding(release: threading.Event) -> Receiver:
    """A receiver that answers no request before ``release`` (or 30 s)."""

    def reply(req: Received) -> Reply:
        release.wait(30)
        return Reply()

    return Receiver(reply)


@pytest.mark.slow
async def test_a_privilege_revoked_mid_run_stops_the_dispatcher_after_a_lease(
    database_url: str, role: str
) -> None:
    grant(database_url, role, *GRANTS)
    db = Db(database_url)
    log = Timed()
    # Retention runs every 0.2 s; only it deletes from delivered, so revoking
    # that leaves every other statement working, the release at shutdown included.
    cfg = fast_config(retention_interval=0.2, grace=0.0, concurrency=4)
    release = threading.Event()
    with holding(release) as receiver:
        total = 12
        for i in range(total):
            db.enqueue(f"revoked-{i}", receiver.url)
        dispatcher = Dispatcher(as_role(database_url, role), cfg, log=log)
        task = asyncio.create_task(dispatcher.run())
        try:
            await asyncio.to_thread(receiver.wait_for, 4, timeout=15)
            revoked = time.monotonic()
            grant(database_url, role, "REVOKE DELETE ON outbox.delivered FROM {role}")
            with pytest.raises(DatabaseUnusable) as failure:
                async with asyncio.timeout(cfg.lease + 15):
                    await task
            stopped = time.monotonic()
        finally:
            release.set()
            dispatcher.stop()
            await asyncio.gather(task, return_exceptions=True)

    assert str(failure.value).startswith(
        f"retention met a permanent database error for {cfg.lease:.0f} s: "
    ), failure.value
    assert "(SQLSTATE 42501)" in str(failure.value)
    errors = [e for e in log.named("db_error") if e["operation"] == "retention"]
    assert errors and all(e["sqlstate"] == "42501" and not e["transient"] for e in errors)
    first_error = errors[0]["at"]
    assert revoked <= first_error
    assert stopped - first_error >= cfg.lease  # it persisted for a lease before the stop
    [failed] = log.named("failed")
    assert failed["error_class"] == "DatabaseUnusable"
    # What it held was given back or recorded: nothing waits for a lease to expire,
    # and nothing was lost.
    assert db.query("SELECT count(*) FROM outbox.messages WHERE state = 'running'") == [(0,)]
    remaining = db.query("SELECT count(*) FROM outbox.messages")[0][0]
    delivered = db.query("SELECT count(*) FROM outbox.delivered")[0][0]
    assert remaining + delivered == total
    released = db.query("SELECT count(*) FROM outbox.attempts WHERE outcome = 'released'")
    assert released == [(dispatcher.stats.released,)]
    assert len(log.named("released")) == dispatcher.stats.released


@pytest.mark.slow
async def test_connections_terminated_again_and_again_do_not_stop_a_drain(
    database_url: str,
) -> None:
    db = Db(database_url)
    log = Timed()
    cfg = fast_config(concurrency=1)
    with Receiver(lambda req: Reply(delay=0.2)) as receiver:
        total = 40  # 8 s of deliveries, one at a time
        for i in range(total):
            db.enqueue(f"terminated-{i}", receiver.url)
        dispatcher = Dispatcher(database_url, cfg, log=log)
        task = asyncio.create_task(dispatcher.run(drain=True))
        try:
            await asyncio.to_thread(receiver.wait_for, 1, timeout=15)
            # Two leases of terminated connections: past the patience for permanent
            # errors, which these are not.
            until = time.monotonic() + 2 * cfg.lease
            with psycopg.connect(database_url, autocommit=True) as admin:
                while time.monotonic() < until:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    assert not task.done(), task
                    await asyncio.sleep(0.1)
            async with asyncio.timeout(60):
                stats = await task
        finally:
            dispatcher.stop()
            await asyncio.gather(task, return_exceptions=True)

    errors = log.named("db_error")
    assert errors, "no statement met a terminated connection"
    assert all(e["transient"] for e in errors), errors
    assert not log.named("failed")
    assert stats.delivered == total
    assert db.query("SELECT count(*) FROM outbox.messages") == [(0,)]


@pytest.mark.slow
def test_a_drain_stopped_while_the_database_fails_does_not_exit_0(
    database_url: str, role: str, fleet: Fleet
) -> None:
    grant(database_url, role, *GRANTS)
    release = threading.Event()
    with holding(release) as receiver:
        try:
            enqueue_many(database_url, f"{receiver.url}/hold", ["held-1"])
            proc = fleet.start(
                as_role(database_url, role),
                *("--drain", "--request-timeout", "1", "--lease", "9"),
            )
            receiver.wait_for(1, timeout=15)
            grant(database_url, role, "REVOKE SELECT ON outbox.messages FROM {role}")
            wait_until(
                lambda: any(e["event"] == "db_error" for e in proc.events()),
                timeout=15,
                what="a database error",
                processes=[proc],
            )
            proc.signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 1, proc.describe()
        finally:
            release.set()
    line = proc.stderr().splitlines()[-1]
    assert line.startswith(
        "outbox dispatch: stopped before the drain finished, while the database was failing: "
    ), proc.describe()
    assert "(SQLSTATE 42501)" in line
