"""Messages of one ordering key are delivered one at a time, in the order their
producers' transactions committed, whoever the producers are and whatever the
dispatcher was doing meanwhile.

A producer of a key holds a transaction-scoped advisory lock on it from the
statement that writes the message to the end of its transaction, so a second
producer of the key waits (a lock wait, seen in ``pg_locks``) and draws its id
only once the first has committed or rolled back: id order is commit order.
Each test interleaves two real connections as two application threads would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from dispatchers.store.messages import Completion
from dispatchers.store.postgres import Store
from outbox import Outbox
from outbox.admin import replay_event, replay_message
from outbox.endpoints import Endpoints
from tests.database import Db
from tests.dispatching import delivered, drain, fast_config, running, wait_until
from tests.receiver import Receiver

KEY = "acct-1"


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


@dataclass(frozen=True)
class Racing:
    """A second producer under way: its backend's pid, and the id it will write."""

    pid: int
    written: Future[int]


def second_producer(
    pool: ThreadPoolExecutor, db: Db, write: Callable[[psycopg.Connection[Any]], int]
) -> Racing:
    """Write in a transaction of its own on a connection of its own, on the pool's
    thread, and commit."""
    conn = psycopg.connect(db.url)

    def run() -> int:
        with conn:
            return write(conn)

    return Racing(conn.info.backend_pid, pool.submit(run))


WAITS = """
SELECT l.locktype, l.mode,
       l.locktype = 'advisory' AND (l.classid, l.objid, l.objsubid)
           = (CAST((h.k >> 32) & 4294967295 AS oid), CAST(h.k & 4294967295 AS oid), 1) AS on_key
FROM pg_locks AS l
CROSS JOIN LATERAL (SELECT hashtextextended(%s, hashtext(%s)) AS k) AS h
WHERE NOT l.granted AND l.pid = %s
"""
"""The locks a session waits for, each with whether it is an ordering key's: the
advisory lock of a bigint (``objsubid`` 1, its halves in ``classid`` and
``objid``) that the producers' statements take (``sql/queries/enqueue.sql``,
fragment ``ordered``), the schema quoted as they quote it."""


def waits_for_key(db: Db, pid: int, key: str = KEY) -> bool:
    """Whether the session ``pid`` waits for the lock of ordering key ``key``;
    fail at once if it waits for another lock."""
    waits = db.query(WAITS, key, '"outbox"', pid)
    assert all(on_key for *_, on_key in waits), f"waiting for another lock than the key's: {waits}"
    return bool(waits)


def wait_for_lock_wait(db: Db, racing: Racing) -> None:
    """Return once the second producer waits on the key's lock; fail loudly if it
    finishes instead, or never waits within 30 s."""
    deadline = time.monotonic() + 30
    while not waits_for_key(db, racing.pid):
        assert not racing.written.done(), (
            f"the second producer did not wait: {racing.written.result()!r}"
        )
        assert time.monotonic() < deadline, "the second producer never waited on the key"
        time.sleep(0.02)


def received(receiver: Receiver) -> list[str]:
    return [r.headers["idempotency-key"].strip('"') for r in receiver.requests]


@pytest.mark.parametrize("dispatching", [False, True], ids=["drained-after", "running-during"])
async def test_a_second_producer_of_a_key_waits_and_both_arrive_in_commit_order(
    db: Db, dispatching: bool
) -> None:
    box = Outbox()
    with Receiver() as receiver, ThreadPoolExecutor(1) as pool:

        def enqueue(conn: psycopg.Connection[Any], key: str) -> int:
            return box.enqueue(
                conn, url=receiver.url, idempotency_key=key, json={}, ordering_key=KEY
            )

        async def interleave() -> tuple[int, int]:
            with psycopg.connect(db.url) as first:
                first_id = enqueue(first, "first")  # A's transaction stays open
                racing = second_producer(pool, db, lambda c: enqueue(c, "second"))
                wait_for_lock_wait(db, racing)  # B waits for A's key, no id drawn yet
                first.commit()
            return first_id, racing.written.result(timeout=30)

        if dispatching:
            async with running(db, fast_config()):
                first_id, second_id = await interleave()
                await wait_until(lambda: len(receiver.requests) >= 2, seconds=30)
        else:
            first_id, second_id = await interleave()
            await drain(db, fast_config())
    assert first_id < second_id  # the id drawn after the first committed
    assert received(receiver) == ["first", "second"]


async def test_the_first_producer_rolling_back_lets_the_second_through_alone(db: Db) -> None:
    box = Outbox()
    with Receiver() as receiver, ThreadPoolExecutor(1) as pool:

        def enqueue(conn: psycopg.Connection[Any], key: str) -> int:
            return box.enqueue(
                conn, url=receiver.url, idempotency_key=key, json={}, ordering_key=KEY
            )

        with psycopg.connect(db.url) as first:
            enqueue(first, "rolled-back")
            racing = second_producer(pool, db, lambda c: enqueue(c, "second"))
            wait_for_lock_wait(db, racing)
            first.rollback()
        racing.written.result(timeout=30)
        await drain(db, fast_config())
    assert received(receiver) == ["second"]


def test_publish_of_a_key_waits_for_the_producer_holding_it(db: Db) -> None:
    box = Outbox()
    with psycopg.connect(db.url) as conn:
        Endpoints().add(conn, url="https://example.com/hook")
    with ThreadPoolExecutor(1) as pool, psycopg.connect(db.url) as first:
        (first_id,) = box.publish(first, "order.paid", {"n": 1}, ordering_key=KEY)
        racing = second_producer(
            pool,
            db,
            lambda c: box.publish(c, "order.paid", {"n": 2}, ordering_key=KEY)[0],
        )
        wait_for_lock_wait(db, racing)
        first.commit()
        second_id = racing.written.result(timeout=30)
    assert first_id < second_id


def test_producers_of_other_keys_and_of_none_do_not_wait(db: Db) -> None:
    box = Outbox()

    def advisory(conn: psycopg.Connection[Any]) -> set[tuple[Any, ...]]:
        rows = conn.execute(
            "SELECT classid, objid, objsubid FROM pg_locks"
            " WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchall()
        return set(rows)

    with psycopg.connect(db.url) as first, psycopg.connect(db.url) as second:
        box.enqueue(first, url="https://a.example/", idempotency_key="a", json={}, ordering_key=KEY)
        # no key, then another key, in a second transaction: neither waits (a wait
        # fails within a second, LockNotAvailable), and only the keyed one takes a
        # lock of its own
        second.execute("SET lock_timeout = '1s'")
        box.enqueue(second, url="https://a.example/", idempotency_key="b", json={})
        unkeyed = advisory(second)
        box.enqueue(
            second, url="https://a.example/", idempotency_key="c", json={}, ordering_key="acct-2"
        )
        assert len(advisory(second) - unkeyed) == 1
        second.commit()
        first.commit()


async def test_a_replayed_message_waits_while_a_later_one_of_its_key_is_running(db: Db) -> None:
    box = Outbox()
    with psycopg.connect(db.url) as conn:
        Endpoints().add(conn, url="https://example.com/hook")
        (early,) = box.publish(conn, "order.paid", {"n": 1}, ordering_key=KEY)
    store = Store(db.url, fast_config())
    await store.open()
    try:
        (job,) = (await store.claim("owner", 10)).messages
        assert job.id == early
        assert (await store.complete("owner", [delivered(job.id, job.attempts)]))[0] == {early}
        with psycopg.connect(db.url) as conn:
            (late,) = box.publish(conn, "order.paid", {"n": 2}, ordering_key=KEY)
        (job,) = (await store.claim("owner", 10)).messages
        assert job.id == late  # running now
        with psycopg.connect(db.url) as conn:
            assert replay_message(conn, message_id=early)
        # the replayed message has the lower id, but its key has one running
        assert (await store.claim("owner", 10)).messages == []
        released = Completion(late, job.attempts, "ready", "released", sent=False)
        assert (await store.complete("owner", [released]))[0] == {late}
        # and once none runs, id order again: the replayed one first, alone
        assert [j.id for j in (await store.claim("owner", 10)).messages] == [early]
    finally:
        await store.close()


def test_an_event_replayed_to_an_endpoint_waits_for_the_producer_holding_its_key(
    db: Db,
) -> None:
    box = Outbox()
    with psycopg.connect(db.url) as conn:
        Endpoints().add(conn, url="https://example.com/old")
        box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt-1", ordering_key=KEY)
        added = Endpoints().add(conn, url="https://example.com/new")
    with ThreadPoolExecutor(1) as pool, psycopg.connect(db.url) as first:
        held = box.publish(first, "order.paid", {"n": 2}, ordering_key=KEY)  # to both
        racing = second_producer(
            pool,
            db,
            lambda c: replay_event(c, event_key="evt-1", endpoint_id=added.id).id,
        )
        wait_for_lock_wait(db, racing)
        first.commit()
        replayed_id = racing.written.result(timeout=30)
    assert max(held) < replayed_id
