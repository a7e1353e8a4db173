"""Enqueue inside the caller's transaction, on all six supported transaction kinds.

Every check of the database state goes through a separate autocommit connection
(``observer``), so it sees only what was committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from outbox import DEFAULT_MAX_ATTEMPTS, IdempotencyKeyReused, Outbox
from outbox.dsn import sqlalchemy_url
from tests.transactions import Observer, Tx, wait_until_blocked_on_a_lock

URL = "https://example.com/hook"
MARKER = "end-of-test-marker"


async def enqueue(tx: Tx, box: Outbox, **kwargs: Any) -> int:
    result: int = await tx.call(box.enqueue, box.enqueue_async, **kwargs)
    return result


def count(observer: Observer, table: str) -> int:
    row = observer.execute(
        sql.SQL("SELECT count(*) FROM outbox.{}").format(sql.Identifier(table))
    ).fetchone()
    assert row is not None
    return int(row[0])


def message_ids(observer: Observer) -> list[int]:
    return [r[0] for r in observer.execute("SELECT id FROM outbox.messages ORDER BY id")]


def key_rows(observer: Observer) -> list[tuple[str, str, int]]:
    return [
        (r[0], r[1], r[2])
        for r in observer.execute(
            "SELECT target, idempotency_key, message_id FROM outbox.message_keys"
            " ORDER BY message_id"
        )
    ]


# -- transactional behaviour ---------------------------------------------------------


async def test_enqueued_message_is_visible_to_others_only_after_commit(
    tx: Tx, observer: Observer
) -> None:
    box = Outbox()
    message_id = await enqueue(tx, box, url=URL, idempotency_key="k1", json={"n": 1})

    assert isinstance(message_id, int)
    assert message_id > 0
    assert tx.in_transaction(), "the library must leave the transaction open"
    assert count(observer, "messages") == 0
    assert count(observer, "message_keys") == 0

    await tx.commit()

    assert message_ids(observer) == [message_id]
    assert key_rows(observer) == [(URL, "k1", message_id)]


async def test_rollback_leaves_no_message_and_no_key(tx: Tx, observer: Observer) -> None:
    box = Outbox()
    first = await enqueue(tx, box, url=URL, idempotency_key="k1", json={"n": 1})
    await enqueue(tx, box, url=URL, idempotency_key="k2", body="two")
    await tx.rollback()

    assert count(observer, "messages") == 0
    assert count(observer, "message_keys") == 0

    # The key is free again: a new transaction writes a new message for it.
    again = await enqueue(tx, box, url=URL, idempotency_key="k1", json={"n": 1})
    await tx.commit()
    assert again != first
    assert message_ids(observer) == [again]


async def test_same_key_and_url_in_the_same_transaction_returns_the_first_id(
    tx: Tx, observer: Observer
) -> None:
    box = Outbox()
    first = await enqueue(tx, box, url=URL, idempotency_key="k1", json={"version": 1})
    # the same request, scheduled otherwise: a retry, not a new request
    second = await enqueue(
        tx,
        box,
        url=URL,
        idempotency_key="k1",
        json={"version": 1},
        ordering_key="o",
        available_at=datetime.now(UTC) + timedelta(hours=1),
        max_attempts=2,
    )
    await tx.commit()

    assert second == first
    assert message_ids(observer) == [first]
    assert key_rows(observer) == [(URL, "k1", first)]
    kept = observer.execute("SELECT ordering_key, max_attempts FROM outbox.messages").fetchone()
    assert kept == (None, DEFAULT_MAX_ATTEMPTS), "the first message is kept, not overwritten"


async def test_same_key_and_url_in_a_later_transaction_returns_the_first_id(
    tx: Tx, observer: Observer
) -> None:
    box = Outbox()
    request = {"url": URL, "idempotency_key": "k1", "json": {"version": 1}}
    first = await enqueue(tx, box, **request, headers={"X-A": "1", "X-B": "2"})
    await tx.commit()

    # header names compare in any case and any order
    second = await enqueue(tx, box, **request, headers={"x-b": "2", "X-a": "1"})
    await tx.commit()
    third = await enqueue(tx, box, **request, headers={"X-B": "2", "X-A": "1"}, method="post")
    await tx.commit()

    assert second == first
    assert third == first
    assert message_ids(observer) == [first]
    assert count(observer, "message_keys") == 1


# what makes a request another one than {"version": 1} with X-Tenant: a, by POST
ANOTHER_REQUEST: dict[str, dict[str, Any]] = {
    "body": {"json": {"version": 2}},
    "content type": {"json": None, "body": b'{"version":1}'},
    "content type given": {"content_type": "application/problem+json"},
    "method": {"method": "PUT"},
    "header value": {"headers": {"X-Tenant": "b"}},
    "header added": {"headers": {"X-Tenant": "a", "X-More": "1"}},
    "header removed": {"headers": None},
}


async def test_same_key_for_another_request_raises_naming_the_message_and_writes_nothing(
    tx: Tx, observer: Observer
) -> None:
    box = Outbox()
    request: dict[str, Any] = {
        "url": URL,
        "idempotency_key": "k1",
        "json": {"version": 1},
        "headers": {"X-Tenant": "a"},
    }
    first = await enqueue(tx, box, **request)
    await tx.commit()

    for what, changed in ANOTHER_REQUEST.items():
        with pytest.raises(IdempotencyKeyReused) as raised:
            await enqueue(tx, box, **{**request, **changed})
        assert (raised.value.key, raised.value.message_id) == ("k1", first), what
        assert str(raised.value) == (
            f"idempotency_key: 'k1' already holds message {first}, made for another request"
            " (method, URL, headers, content type or body); a new request needs a new key"
        )
    # the transaction is still usable, and nothing was written to it
    other = await enqueue(tx, box, **{**request, "idempotency_key": "k2"})
    await tx.commit()

    assert message_ids(observer) == [first, other]
    assert key_rows(observer) == [(URL, "k1", first), (URL, "k2", other)]


async def test_psycopg_connections_with_a_dict_row_factory_work(database_url: str) -> None:
    # The application's row factory is its own: enqueue and publish read tuples.
    box = Outbox()
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        first = box.enqueue(conn, url=URL, idempotency_key="rf-1", json={})
        again = box.enqueue(conn, url=URL, idempotency_key="rf-1", json={})
        assert box.publish(conn, "order.paid", {}) == []
    async with await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row) as aconn:
        other = await box.enqueue_async(aconn, url=URL, idempotency_key="rf-2", json={})
        same = await box.enqueue_async(aconn, url=URL, idempotency_key="rf-2", json={})
    assert again == first
    assert same == other != first


async def test_same_key_for_another_url_is_another_message(tx: Tx, observer: Observer) -> None:
    box = Outbox()
    a = await enqueue(tx, box, url=URL, idempotency_key="k1", json={})
    b = await enqueue(tx, box, url=URL + "/other", idempotency_key="k1", json={})
    c = await enqueue(tx, box, url=URL, idempotency_key="k2", json={})
    await tx.commit()

    assert len({a, b, c}) == 3
    assert message_ids(observer) == sorted([a, b, c])
    assert key_rows(observer) == sorted(
        [(URL, "k1", a), (URL + "/other", "k1", b), (URL, "k2", c)], key=lambda r: r[2]
    )


# -- what is stored ------------------------------------------------------------------

COLUMNS = (
    "idempotency_key, target, endpoint_id, url, method, headers, body, content_type,"
    " event_type, ordering_key, state, attempts, max_attempts, available_at,"
    " lease_owner, lease_until, last_error, last_status, completed_at"
)


def stored(observer: Observer, message_id: int) -> dict[str, Any]:
    cur = observer.execute(f"SELECT {COLUMNS} FROM outbox.messages WHERE id = %s", (message_id,))
    row = cur.fetchone()
    assert row is not None, f"message {message_id} is not stored"
    assert cur.description is not None
    return {col.name: value for col, value in zip(cur.description, row, strict=True)}


async def test_stored_message_has_the_given_values(tx: Tx, observer: Observer) -> None:
    box = Outbox()
    when = datetime.now(UTC).replace(microsecond=123456) + timedelta(hours=1)
    message_id = await enqueue(
        tx,
        box,
        url="http://127.0.0.1:8080/pay?x=1",
        idempotency_key="pay-42",
        body=b"\x00\x01\xffbinary",
        content_type="application/x-thing",
        method="put",
        headers={"X-Trace": "t-1", "Authorization": "Bearer abc"},
        ordering_key="account-7",
        available_at=when,
        max_attempts=3,
    )
    await tx.commit()

    assert stored(observer, message_id) == {
        "idempotency_key": "pay-42",
        "target": "http://127.0.0.1:8080/pay?x=1",
        "endpoint_id": None,
        "url": "http://127.0.0.1:8080/pay?x=1",
        "method": "PUT",
        "headers": {"X-Trace": "t-1", "Authorization": "Bearer abc"},
        "body": b"\x00\x01\xffbinary",
        "content_type": "application/x-thing",
        "event_type": None,
        "ordering_key": "account-7",
        "state": "ready",
        "attempts": 0,
        "max_attempts": 3,
        "available_at": when,
        "lease_owner": None,
        "lease_until": None,
        "last_error": None,
        "last_status": None,
        "completed_at": None,
    }


async def test_stored_message_defaults(tx: Tx, observer: Observer) -> None:
    box = Outbox()
    json_id = await enqueue(tx, box, url=URL, idempotency_key="j", json={"b": [1, "\u00e9"]})
    text_id = await enqueue(tx, box, url=URL, idempotency_key="t", body="h\u00e9")
    bytes_id = await enqueue(
        tx, Outbox(max_attempts=5), url=URL, idempotency_key="b", body=b"raw", method="delete"
    )
    await tx.commit()

    json_row = stored(observer, json_id)
    assert (json_row["method"], json_row["headers"], json_row["body"]) == (
        "POST",
        {},
        '{"b":[1,"\u00e9"]}'.encode(),
    )
    assert json_row["content_type"] == "application/json"
    assert (json_row["state"], json_row["attempts"], json_row["max_attempts"]) == ("ready", 0, 12)
    assert json_row["ordering_key"] is None

    text_row = stored(observer, text_id)
    assert (text_row["body"], text_row["content_type"]) == (
        "h\u00e9".encode(),
        "text/plain; charset=utf-8",
    )
    bytes_row = stored(observer, bytes_id)
    assert (bytes_row["body"], bytes_row["content_type"], bytes_row["method"]) == (
        b"raw",
        "application/octet-stream",
        "DELETE",
    )
    assert bytes_row["max_attempts"] == 5

    # Without available_at a message is due at once: at its transaction's now().
    times = observer.execute(
        "SELECT DISTINCT available_at = created_at FROM outbox.messages"
    ).fetchall()
    assert times == [(True,)]


# -- wrong transaction kinds -----------------------------------------------------------


async def test_transaction_of_the_other_mode_raises_type_error_and_sends_nothing(
    tx: Tx, observer: Observer
) -> None:
    box = Outbox()
    expected = (
        r"is asynchronous: use the \*_async method"
        if tx.is_async
        else "is synchronous: use the method without _async"
    )
    with pytest.raises(TypeError, match=expected):
        await tx.call_other_mode(
            box.enqueue, box.enqueue_async, url=URL, idempotency_key="k1", json={}
        )

    assert not tx.in_transaction(), "nothing may be sent to the server"
    await tx.commit()
    assert count(observer, "messages") == 0
    assert count(observer, "message_keys") == 0


def test_unsupported_objects_raise_type_error(database_url: str) -> None:
    box = Outbox()
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        for not_a_tx in (object(), engine, None, "postgresql://"):
            with pytest.raises(TypeError, match="tx must be a SQLAlchemy Session or Connection"):
                box.enqueue(not_a_tx, url=URL, idempotency_key="k1", json={})
    finally:
        engine.dispose()
    with psycopg.connect(database_url) as conn, conn.cursor() as cursor:
        with pytest.raises(TypeError, match="not Cursor"):
            box.enqueue(cursor, url=URL, idempotency_key="k1", json={})
        assert conn.info.transaction_status == TransactionStatus.IDLE


async def test_unsupported_objects_raise_type_error_in_enqueue_async(database_url: str) -> None:
    box = Outbox()
    engine = create_async_engine(sqlalchemy_url(database_url))
    try:
        for not_a_tx in (object(), engine, None):
            with pytest.raises(TypeError, match="tx must be a SQLAlchemy AsyncSession"):
                await box.enqueue_async(not_a_tx, url=URL, idempotency_key="k1", json={})
    finally:
        await engine.dispose()


# -- concurrent enqueues of one key ----------------------------------------------------


@pytest.mark.parametrize("second_by", ["first", "second"])  # the same request, or another
@pytest.mark.parametrize("first_outcome", ["commit", "rollback"])
def test_concurrent_enqueue_of_one_key_waits_for_the_first_transaction(
    database_url: str, observer: Observer, first_outcome: str, second_by: str
) -> None:
    box = Outbox()
    # Exit order matters if the test fails: first releases its key, then the racing
    # thread can finish, then the pool joins it.
    with (
        ThreadPoolExecutor(max_workers=1) as pool,
        psycopg.connect(database_url) as second,
        psycopg.connect(database_url) as first,
    ):
        first_id = box.enqueue(first, url=URL, idempotency_key="race", json={"by": "first"})
        racing = pool.submit(
            box.enqueue, second, url=URL, idempotency_key="race", json={"by": second_by}
        )
        wait_until_blocked_on_a_lock(observer, second.info.backend_pid)
        assert not racing.done()

        if first_outcome == "commit":
            first.commit()
        else:
            first.rollback()
        if first_outcome == "commit" and second_by == "second":
            with pytest.raises(IdempotencyKeyReused) as raised:
                racing.result(timeout=10)
            assert raised.value.message_id == first_id
            second_id = first_id
        else:
            second_id = racing.result(timeout=10)
        second.commit()

    rows = observer.execute("SELECT id, body FROM outbox.messages").fetchall()
    if first_outcome == "commit":
        assert second_id == first_id
        assert rows == [(first_id, b'{"by":"first"}')]
    else:
        assert second_id != first_id
        assert rows == [(second_id, b'{"by":"%s"}' % second_by.encode())]
    assert key_rows(observer) == [(URL, "race", rows[0][0])]


# -- NOTIFY ----------------------------------------------------------------------------


def listen(database_url: str) -> Observer:
    conn = psycopg.connect(database_url, autocommit=True)
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(Outbox().queries.channel)))
    return conn


def try_wake_lock(conn: Observer) -> bool:
    """Take the wake lock as a dispatcher does before it waits for notifications."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", Outbox().queries.wake_lock)
    return bool(row.fetchone()[0])  # type: ignore[index]


@pytest.fixture
def listener(database_url: str) -> Iterator[Observer]:
    """A dispatcher waiting for notifications: listening, holding the wake lock."""
    conn = listen(database_url)
    assert try_wake_lock(conn)
    yield conn
    conn.close()


def notifications_before_marker(listener: Observer, observer: Observer) -> list[tuple[str, str]]:
    """Every notification the listener got before a marker sent now, on the same channel.

    Notifications are delivered in commit order, so once the marker (committed after
    whatever the test did) arrives, nothing the test committed can still be on its way.
    """
    channel = Outbox().queries.channel
    observer.execute("SELECT pg_notify(%s, %s)", (channel, MARKER))
    received: list[tuple[str, str]] = []
    for notification in listener.notifies(timeout=10):
        if notification.payload == MARKER:
            return received
        received.append((notification.channel, notification.payload))
    raise AssertionError(f"the marker never arrived; received {received}")


async def test_notify_sends_one_notification_per_committed_transaction(
    tx: Tx, listener: Observer, observer: Observer
) -> None:
    box = Outbox(notify=True)
    for key in ("a", "b", "c"):
        await enqueue(tx, box, url=URL, idempotency_key=key, json={})
    await enqueue(tx, box, url=URL, idempotency_key="a", json={})  # duplicate: no insert
    assert notifications_before_marker(listener, observer) == [], "nothing before commit"

    await tx.commit()
    assert notifications_before_marker(listener, observer) == [("outbox_ready", "")]
    assert count(observer, "messages") == 3


async def test_no_notification_while_no_dispatcher_waits(
    tx: Tx, database_url: str, observer: Observer
) -> None:
    busy = listen(database_url)  # listening, but not holding the wake lock
    try:
        await enqueue(tx, Outbox(notify=True), url=URL, idempotency_key="a", json={})
        await tx.commit()
        assert notifications_before_marker(busy, observer) == []
        assert count(observer, "messages") == 1
    finally:
        busy.close()


async def test_open_enqueue_keeps_a_dispatcher_from_starting_to_wait(
    tx: Tx, database_url: str, observer: Observer
) -> None:
    # Until the enqueuing transaction ends, a dispatcher cannot start waiting for
    # notifications (this transaction would not send one); once it has, the
    # dispatcher's next claim sees the message.
    await enqueue(tx, Outbox(notify=True), url=URL, idempotency_key="a", json={})
    dispatcher = listen(database_url)
    try:
        assert not try_wake_lock(dispatcher)
        await tx.commit()
        assert try_wake_lock(dispatcher)
        assert count(observer, "messages") == 1
    finally:
        dispatcher.close()


async def test_rolled_back_transaction_sends_no_notification(
    tx: Tx, listener: Observer, observer: Observer
) -> None:
    box = Outbox(notify=True)
    await enqueue(tx, box, url=URL, idempotency_key="a", json={})
    await tx.rollback()
    assert notifications_before_marker(listener, observer) == []


async def test_notify_off_sends_no_notification(
    tx: Tx, listener: Observer, observer: Observer
) -> None:
    box = Outbox(notify=False)
    for key in ("a", "b", "c"):
        await enqueue(tx, box, url=URL, idempotency_key=key, json={})
    await tx.commit()
    assert notifications_before_marker(listener, observer) == []
    assert count(observer, "messages") == 3
