"""Per ordering key, ids follow commit order whichever producer writes, because
every producer takes the key's lock *before* it draws the message's id.

Each test runs one probe through one producer: a holder writes key K in an open
transaction; a second producer writes K and waits on the key's lock (seen by
the server as a wait on an advisory lock); the holder writes K once more and
commits; then the waiter goes on and commits. The waiter committed last, so
its id must be above the holder's second. Had it drawn its id before it waited,
with the lock still taken, its id would lie between the holder's two, and a
receiver would get the holder's first message, the waiter's, then the holder's
second: not the order of their commits. Taking no lock at all is another fault
(``test_ordering_keys.py`` sees that one: the second producer never waits). The
last test mixes producers, the library holding and a SQL function waiting: both
lock the same key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
import pytest

from outbox import Outbox
from outbox.admin import replay_event
from outbox.endpoints import Endpoints

Conn = psycopg.Connection[tuple[Any, ...]]
Write = Callable[[Conn, str], list[int]]
"""A producer's write of key ``KEY`` in the caller's transaction, named ``name``
(its idempotency or event key); the ids it wrote."""

KEY = "acct-7"
WAIT_S = 30.0


def waits_on_an_advisory_lock(url: str, pid: int) -> bool:
    """Whether the session ``pid`` waits for an advisory lock now."""
    # a connection of its own, autocommit: within one transaction the server
    # answers pg_stat_activity from a snapshot taken at its first read
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return row == ("Lock", "advisory")


def wait_until_blocked(url: str, pid: int, waiter: Future[list[int]]) -> None:
    """Return once session ``pid`` waits on the key's lock; fail loudly if its write
    finishes first, or if it does not wait within ``WAIT_S`` seconds."""
    deadline = time.monotonic() + WAIT_S
    while not waits_on_an_advisory_lock(url, pid):
        assert not waiter.done(), f"the second producer did not wait: {waiter.result()!r}"
        assert time.monotonic() < deadline, "the second producer never waited on the key"
        time.sleep(0.01)  # the poll's pace; the condition is the server's wait event


def probe(url: str, holder_writes: Write, waiter_writes: Write) -> tuple[list[int], list[int]]:
    """The holder's second write's ids and the waiter's, once both committed."""

    def waiter_commits(conn: Conn) -> list[int]:
        written = waiter_writes(conn, "waiter")
        conn.commit()
        return written

    with (
        ThreadPoolExecutor(1) as pool,
        psycopg.connect(url) as waiter,
        psycopg.connect(url) as holder,
    ):
        first = holder_writes(holder, "holder-1")
        assert first, "the holder wrote nothing"
        pid = waiter.info.backend_pid
        waiting = pool.submit(waiter_commits, waiter)  # the waiter's thread alone uses it now
        wait_until_blocked(url, pid, waiting)
        second = holder_writes(holder, "holder-2")
        holder.commit()
        waited = waiting.result(timeout=WAIT_S)
    assert second and waited, "a write wrote nothing"
    assert max(first) < min(second)
    return second, waited


def committed_in_order(second: list[int], waited: list[int]) -> None:
    assert min(waited) > max(second), (
        f"the waiter's ids {waited} were drawn before the holder's second write's {second},"
        " which committed first"
    )


@pytest.fixture
def two_endpoints(database_url: str) -> list[int]:
    with psycopg.connect(database_url) as conn:
        return [Endpoints().add(conn, url=f"https://example.com/hook-{n}").id for n in (1, 2)]


def test_library_enqueue_draws_the_id_after_the_keys_lock(database_url: str) -> None:
    def enqueue(conn: Conn, name: str) -> list[int]:
        return [
            Outbox().enqueue(
                conn, url="https://example.com/hook", idempotency_key=name, json={},
                ordering_key=KEY,
            )
        ]  # fmt: skip

    committed_in_order(*probe(database_url, enqueue, enqueue))


def test_library_publish_draws_the_ids_after_the_keys_lock(
    database_url: str, two_endpoints: list[int]
) -> None:
    def publish(conn: Conn, name: str) -> list[int]:
        ids = Outbox().publish(conn, "order.paid", {"by": name}, idempotency_key=name,
                               ordering_key=KEY)  # fmt: skip
        assert len(ids) == len(two_endpoints)
        return ids

    committed_in_order(*probe(database_url, publish, publish))


def test_sql_function_enqueue_draws_the_id_after_the_keys_lock(database_url: str) -> None:
    def enqueue(conn: Conn, name: str) -> list[int]:
        row = conn.execute(
            "SELECT outbox.enqueue(url => 'https://example.com/hook', idempotency_key => %s,"
            " json_body => '{}', ordering_key => %s)",
            (name, KEY),
        ).fetchone()
        assert row is not None
        return [row[0]]

    committed_in_order(*probe(database_url, enqueue, enqueue))


def test_sql_function_publish_draws_the_ids_after_the_keys_lock(
    database_url: str, two_endpoints: list[int]
) -> None:
    def publish(conn: Conn, name: str) -> list[int]:
        row = conn.execute(
            "SELECT outbox.publish(event_type => 'order.paid', payload => '{}',"
            " idempotency_key => %s, ordering_key => %s)",
            (name, KEY),
        ).fetchone()
        assert row is not None and len(row[0]) == len(two_endpoints)
        return list(row[0])

    committed_in_order(*probe(database_url, publish, publish))


def test_replay_of_an_event_draws_the_id_after_the_keys_lock(database_url: str) -> None:
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        Endpoints().add(conn, url="https://example.com/old")
        box.publish(conn, "order.paid", {"n": 0}, idempotency_key="evt-0", ordering_key=KEY)
        added = Endpoints().add(conn, url="https://example.com/new").id

    def publish(conn: Conn, name: str) -> list[int]:
        return box.publish(conn, "order.paid", {"by": name}, idempotency_key=name,
                           ordering_key=KEY)  # fmt: skip

    def replay(conn: Conn, name: str) -> list[int]:
        replayed = replay_event(conn, event_key="evt-0", endpoint_id=added)
        assert replayed.created
        return [replayed.id]

    committed_in_order(*probe(database_url, publish, replay))


def test_the_library_and_the_sql_functions_take_one_lock_per_key(
    database_url: str, two_endpoints: list[int]
) -> None:
    # a holder writing through the library, a waiter through a SQL function:
    # both lock the same key (the schema's seed), so the waiter waits, and draws after
    def enqueue(conn: Conn, name: str) -> list[int]:
        return [
            Outbox().enqueue(
                conn, url="https://example.com/hook", idempotency_key=name, json={},
                ordering_key=KEY,
            )
        ]  # fmt: skip

    def publish(conn: Conn, name: str) -> list[int]:
        row = conn.execute(
            "SELECT outbox.publish(event_type => 'order.paid', payload => '{}',"
            " idempotency_key => %s, ordering_key => %s)",
            (name, KEY),
        ).fetchone()
        assert row is not None
        return list(row[0])

    committed_in_order(*probe(database_url, enqueue, publish))
