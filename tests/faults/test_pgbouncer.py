"""The whole path behind PgBouncer in transaction mode: enqueue (psycopg and a
SQLAlchemy Session) and two ``outbox dispatch --no-listen`` processes.

In transaction mode every transaction may run on a different server connection,
and several clients share each one (here 4 server connections serve the
enqueuers and both dispatchers' pools). Anything that relies on session state
(LISTEN, session settings, named prepared statements on a PgBouncer older than
1.21) breaks here; the dispatcher must not. PgBouncer before 1.21 cannot keep
protocol-level prepared statements, so then the enqueuers run with
``prepare_threshold=None``; the dispatchers prepare theirs with SQL ``PREPARE``
and prepare again on a server connection that lacks one.

The runs are fault-free, so the invariants are strict: every message delivered
once, one attempt each, each key reaching the receiver exactly once, no database
error logged, both processes exiting 0.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy
from sqlalchemy.orm import Session

from outbox import Outbox
from outbox.dsn import sqlalchemy_url
from tests.faults.pgbouncer import (
    PgBouncer,
    pgbouncer_binary,
    pgbouncer_version,
    start_pgbouncer,
)
from tests.processes import DispatcherProcess, Fleet, query, scalar, structured_key
from tests.receiver import Received, Receiver

pytestmark = pytest.mark.timeout(60)

POOL_SIZE = 4
RELAXED = ("--request-timeout", "10", "--connect-timeout", "5", "--lease", "30")


@pytest.fixture(scope="module")
def pgbouncer_bin() -> tuple[str, tuple[int, ...]]:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip(
            "pgbouncer is not installed (Debian: apt-get install pgbouncer; .ci/run "
            "installs it when apt-get is available)"
        )
    return binary, pgbouncer_version(binary)


@pytest.fixture
def bouncer(pgbouncer_bin: tuple[str, tuple[int, ...]], database_url: str) -> Iterator[PgBouncer]:
    binary, version = pgbouncer_bin
    with start_pgbouncer(
        binary,
        database_url,
        pool_size=POOL_SIZE,
        # PgBouncer keeps protocol-level prepared statements from 1.21 on
        max_prepared_statements=100 if version >= (1, 21) else None,
    ) as bouncer:
        yield bouncer


def prepares(bouncer: PgBouncer) -> bool:
    return bouncer.version >= (1, 21)


def client_kwargs(bouncer: PgBouncer) -> dict[str, Any]:
    """psycopg connection arguments for an application behind this PgBouncer."""
    return {} if prepares(bouncer) else {"prepare_threshold": None}


def dispatch_args(*extra: str) -> tuple[str, ...]:
    # the dispatcher's SQL-level prepared statements work whatever PgBouncer can keep
    return (*RELAXED, "--no-listen", "--poll-interval", "0.2", "--drain", *extra)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as fleet:
        yield fleet


def snapshot(receiver: Receiver) -> list[Received]:
    with receiver.lock:
        return list(receiver.requests)


def assert_clean_logs(procs: list[DispatcherProcess]) -> list[dict[str, Any]]:
    """No database, listener or internal error in any process; return all events."""
    events = [e for p in procs for e in p.events()]
    trouble = [
        e
        for e in events
        if e["event"] in ("db_error", "internal_error", "listen_error", "outcome_dropped")
    ]
    assert not trouble, trouble[:5]
    return events


def test_two_dispatchers_behind_pgbouncer_transaction_mode_deliver_each_key_once(
    database_url: str, bouncer: PgBouncer, fleet: Fleet
) -> None:
    total, writers = 1000, 2
    keys = [f"bouncer-{i:04d}" for i in range(total)]
    box = Outbox(notify=False)  # nobody LISTENs behind a transaction pooler
    with Receiver() as receiver:
        target = f"{receiver.url}/hook"
        ids: dict[str, int] = {}
        errors: list[BaseException] = []

        def enqueue(part: list[str]) -> None:
            try:
                with psycopg.connect(bouncer.url, **client_kwargs(bouncer)) as conn:
                    for start in range(0, len(part), 100):
                        with conn.transaction():
                            for key in part[start : start + 100]:
                                ids[key] = box.enqueue(
                                    conn, url=target, idempotency_key=key, json={"key": key}
                                )
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=enqueue, args=(keys[i::writers],)) for i in range(writers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors, errors
        assert len(set(ids.values())) == total

        procs = [fleet.start(bouncer.url, *dispatch_args("--concurrency", "32")) for _ in range(2)]
        for proc in procs:
            rc = proc.wait(timeout=45)
            assert rc == 0, proc.describe() + bouncer.describe()
        requests = snapshot(receiver)

    assert scalar(database_url, "SELECT count(*) FROM outbox.messages") == 0
    delivered = query(
        database_url, "SELECT id, idempotency_key, attempts, last_status FROM outbox.delivered"
    )
    assert sorted(row[0] for row in delivered) == sorted(ids.values())
    assert sorted(row[1] for row in delivered) == keys
    assert {(row[2], row[3]) for row in delivered} == {(1, 200)}
    attempts = query(
        database_url, "SELECT message_id, attempt, outcome, owner FROM outbox.attempts"
    )
    assert len(attempts) == total
    assert {(row[1], row[2]) for row in attempts} == {(1, "delivered")}
    assert all(any(p.owns(row[3]) for p in procs) for row in attempts)

    # fault-free: each key reached the receiver exactly once
    seen = collections.Counter(r.headers.get("idempotency-key", "") for r in requests)
    assert seen == collections.Counter(structured_key(k) for k in keys)

    events = assert_clean_logs(procs)
    delivered_events = [e["message_id"] for e in events if e["event"] == "delivered"]
    assert sorted(delivered_events) == sorted(ids.values())


def test_sqlalchemy_session_enqueue_behind_pgbouncer(
    database_url: str, bouncer: PgBouncer, fleet: Fleet
) -> None:
    box = Outbox(notify=False)
    engine = sqlalchemy.create_engine(
        sqlalchemy_url(bouncer.url), connect_args=client_kwargs(bouncer), pool_size=2
    )
    keys = [f"orm-{i:03d}" for i in range(60)]
    try:
        with Receiver() as receiver:
            target = f"{receiver.url}/orm"
            ids: list[int] = []
            with Session(engine) as session:
                for start in range(0, len(keys), 20):
                    with session.begin():
                        ids += [
                            box.enqueue(session, url=target, idempotency_key=k, json={"k": k})
                            for k in keys[start : start + 20]
                        ]
                # the same key again, in a later transaction: the same message
                with session.begin():
                    assert (
                        box.enqueue(
                            session, url=target, idempotency_key=keys[0], json={"k": keys[0]}
                        )
                        == ids[0]
                    )
                # a rolled-back transaction leaves no message behind
                with pytest.raises(RuntimeError), session.begin():
                    box.enqueue(session, url=target, idempotency_key="orm-rolled-back", json={})
                    raise RuntimeError("roll back")
            assert len(set(ids)) == len(keys)
            assert scalar(database_url, "SELECT count(*) FROM outbox.messages") == len(keys)

            proc = fleet.start(bouncer.url, *dispatch_args())
            rc = proc.wait(timeout=30)
            assert rc == 0, proc.describe() + bouncer.describe()
            requests = snapshot(receiver)
    finally:
        engine.dispose()

    assert sorted(row[0] for row in query(database_url, "SELECT id FROM outbox.delivered")) == ids
    seen = collections.Counter(r.headers.get("idempotency-key", "") for r in requests)
    assert seen == collections.Counter(structured_key(k) for k in keys)
    assert_clean_logs([proc])
