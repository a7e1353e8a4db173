"""The receiver's inbox: claim a key once, inside the receiver's own transaction.

Runs on all six transaction kinds. Committed state is read through a separate
autocommit connection (``observer``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from outbox import ConfigurationError, InvalidMessage
from outbox.receiver import Inbox
from tests.errors import invalid_argument
from tests.transactions import Observer, Tx, open_tx

BAD_KEYS: list[object] = ["", "x" * 256, "line\nbreak", " padded", "caf\u00e9", 42, None]


async def claim(tx: Tx, inbox: Inbox, key: Any) -> bool:
    result: bool = await tx.call(inbox.claim, inbox.claim_async, key)
    return result


@pytest.fixture
def inbox(observer: Observer) -> Inbox:
    """The default inbox, its table created and committed."""
    box = Inbox()
    box.ensure_schema(observer)
    return box


def claimed(observer: Observer, schema: str = "outbox_inbox") -> list[str]:
    query = sql.SQL("SELECT key FROM {} ORDER BY key").format(sql.Identifier(schema, "inbox"))
    return [row[0] for row in observer.execute(query)]


def table_exists(observer: Observer, schema: str) -> bool:
    name = sql.Identifier(schema, "inbox").as_string(None)
    row = observer.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def blocked_by(observer: Observer, waiter: int, holder: int) -> bool:
    row = observer.execute("SELECT %s = ANY(pg_blocking_pids(%s))", (holder, waiter)).fetchone()
    return bool(row and row[0])


# --- on every transaction kind ------------------------------------------------------------


async def test_claim_is_true_the_first_time_and_false_in_later_transactions(
    tx: Tx, inbox: Inbox, observer: Observer
) -> None:
    assert await claim(tx, inbox, "order-1") is True
    await tx.commit()
    assert await claim(tx, inbox, "order-1") is False
    assert await claim(tx, inbox, "order-2") is True
    await tx.commit()
    assert await claim(tx, inbox, "order-2") is False
    await tx.commit()
    assert claimed(observer) == ["order-1", "order-2"]


async def test_claim_is_false_for_a_key_claimed_earlier_in_the_same_transaction(
    tx: Tx, inbox: Inbox, observer: Observer
) -> None:
    assert await claim(tx, inbox, "k") is True
    assert await claim(tx, inbox, "k") is False
    assert claimed(observer) == []
    await tx.commit()
    assert claimed(observer) == ["k"]


@pytest.mark.slow
async def test_rolled_back_claim_leaves_the_key_claimable(
    tx: Tx, inbox: Inbox, observer: Observer
) -> None:
    assert await claim(tx, inbox, "msg_1") is True
    await tx.rollback()
    assert claimed(observer) == []
    assert await claim(tx, inbox, "msg_1") is True
    await tx.commit()
    assert claimed(observer) == ["msg_1"]


async def test_bad_key_raises_invalid_message_and_sends_nothing(
    tx: Tx, inbox: Inbox, observer: Observer
) -> None:
    for key in BAD_KEYS:
        with pytest.raises(InvalidMessage) as info:
            await claim(tx, inbox, key)
        assert info.value.field == "key", key
        assert not tx.in_transaction(), key
    assert claimed(observer) == []


async def test_purge_forgets_old_keys_in_bounded_batches(
    tx: Tx, inbox: Inbox, observer: Observer
) -> None:
    for key in ("old-1", "old-2", "old-3", "new-1"):
        assert await claim(tx, inbox, key) is True
    await tx.commit()
    observer.execute(
        "UPDATE outbox_inbox.inbox SET received_at = now() - interval '8 days'"
        " WHERE key LIKE 'old-%'"
    )
    week = timedelta(days=7)
    assert await tx.call(inbox.purge, inbox.purge_async, week, limit=2) == 2
    await tx.commit()
    assert len(claimed(observer)) == 2
    assert await tx.call(inbox.purge, inbox.purge_async, week, limit=2) == 1
    assert await tx.call(inbox.purge, inbox.purge_async, week) == 0
    await tx.commit()
    assert claimed(observer) == ["new-1"]
    # a purged key is claimable again: the reason to keep keys long enough
    assert await claim(tx, inbox, "old-1") is True
    assert await claim(tx, inbox, "new-1") is False
    await tx.commit()


async def test_purge_refuses_bad_bounds_and_sends_nothing(tx: Tx, inbox: Inbox) -> None:
    bad: list[tuple[Any, Any, str]] = [
        (timedelta(0), 10, "older_than"),
        (timedelta(days=-1), 10, "older_than"),
        (3600, 10, "older_than"),
        (timedelta(days=1), 0, "limit"),
        (timedelta(days=1), True, "limit"),
        (timedelta(days=1), 2.5, "limit"),
    ]
    for older_than, limit, field in bad:
        with invalid_argument(field, match=f"^{field}: "):
            await tx.call(inbox.purge, inbox.purge_async, older_than, limit=limit)
        assert not tx.in_transaction(), (older_than, limit)


async def test_claim_in_the_wrong_mode_raises_type_error(tx: Tx, inbox: Inbox) -> None:
    with pytest.raises(TypeError):
        await tx.call_other_mode(inbox.claim, inbox.claim_async, "k")


async def test_ensure_schema_creates_a_custom_schema_and_is_idempotent(
    tx: Tx, observer: Observer
) -> None:
    inbox = Inbox(schema="receiver_inbox")
    await tx.call(inbox.ensure_schema, inbox.ensure_schema_async)
    await tx.call(inbox.ensure_schema, inbox.ensure_schema_async)
    await tx.commit()
    await tx.call(inbox.ensure_schema, inbox.ensure_schema_async)
    assert await claim(tx, inbox, "k") is True
    await tx.commit()
    assert claimed(observer, "receiver_inbox") == ["k"]
    assert not table_exists(observer, "outbox_inbox")


# --- concurrency ----------------------------------------------------------------------------


@pytest.mark.parametrize("first_ends_with", ["commit", "rollback"])
def test_a_concurrent_claim_waits_for_the_first_transaction(
    database_url: str, inbox: Inbox, observer: Observer, first_ends_with: str
) -> None:
    with (
        psycopg.connect(database_url) as first,
        psycopg.connect(database_url) as second,
        ThreadPoolExecutor(1) as pool,
    ):
        assert inbox.claim(first, "k") is True
        pending = pool.submit(inbox.claim, second, "k")
        wait_until(lambda: blocked_by(observer, second.info.backend_pid, first.info.backend_pid))
        assert not pending.done()
        if first_ends_with == "commit":
            first.commit()
        else:
            first.rollback()
        second_claimed = pending.result(timeout=10)
        second.commit()
    assert second_claimed is (first_ends_with == "rollback")
    assert claimed(observer) == ["k"]


def test_exactly_one_of_two_racing_transactions_claims_a_key(
    database_url: str, inbox: Inbox, observer: Observer
) -> None:
    start = threading.Barrier(2)

    def claim_and_commit(key: str) -> bool:
        with psycopg.connect(database_url) as conn:
            start.wait(timeout=10)
            won = inbox.claim(conn, key)
            conn.commit()
            return won

    keys = [f"race-{i}" for i in range(20)]
    with ThreadPoolExecutor(2) as pool:
        for key in keys:
            results = sorted(pool.map(claim_and_commit, [key, key]))
            assert results == [False, True], key
    assert claimed(observer) == sorted(keys)


def test_ensure_schema_from_many_transactions_at_once_succeeds(
    database_url: str, observer: Observer
) -> None:
    inbox = Inbox(schema="racing_inbox")
    workers = 8
    start = threading.Barrier(workers)

    def ensure() -> None:
        with psycopg.connect(database_url) as conn:
            start.wait(timeout=10)
            inbox.ensure_schema(conn)
            conn.commit()

    with ThreadPoolExecutor(workers) as pool:
        for done in [pool.submit(ensure) for _ in range(workers)]:
            done.result(timeout=30)
    assert table_exists(observer, "racing_inbox")


def test_ensure_schema_takes_no_lock_once_the_table_exists(database_url: str, inbox: Inbox) -> None:
    with psycopg.connect(database_url) as conn:
        inbox.ensure_schema(conn)
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchone()
        assert row == (0,)


# --- setup and errors -------------------------------------------------------------------------


def test_create_sql_builds_the_same_table_as_ensure_schema(
    database_url: str, observer: Observer
) -> None:
    inbox = Inbox(schema="migrated_inbox")
    observer.execute(inbox.create_sql())
    observer.execute(inbox.create_sql())
    with psycopg.connect(database_url) as conn:
        inbox.ensure_schema(conn)
        assert inbox.claim(conn, "k") is True
        conn.commit()
    row = observer.execute(
        "SELECT received_at IS NOT NULL, received_at <= now() FROM migrated_inbox.inbox"
    ).fetchone()
    assert row == (True, True)


def test_claim_before_ensure_schema_says_what_to_do(database_url: str) -> None:
    with psycopg.connect(database_url) as conn, pytest.raises(ConfigurationError, match="ensure"):
        Inbox(schema="never_created").claim(conn, "k")


async def test_claim_async_before_ensure_schema_says_what_to_do(database_url: str) -> None:
    async with AsyncExitStack() as stack:
        tx = await open_tx("sqlalchemy-async-session", database_url, stack)
        with pytest.raises(ConfigurationError, match="ensure"):
            await claim(tx, Inbox(schema="never_created"), "k")


@pytest.mark.parametrize("schema", ["", "bad-name", 'x"; DROP TABLE y; --', "a" * 49])
def test_inbox_rejects_a_schema_that_is_not_a_plain_identifier(schema: str) -> None:
    with pytest.raises(ConfigurationError, match="schema"):
        Inbox(schema=schema)
