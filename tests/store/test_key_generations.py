"""Idempotency keys and event records by generation (migration 0033): a key or an
event of the previous generation still dedupes; a turn drops the generation
before it whole, after the keys of the messages still in the outbox were carried
forward; a producer held up by a turn finds every key written before it; under
REPEATABLE READ a producer whose snapshot predates a turn is told to retry; and a
turn behind a long transaction gives up at once instead of stopping producers."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from dispatchers.store.postgres import DDL_LOCK_TIMEOUT, Store
from outbox import Endpoints, Outbox
from outbox.admin import replay_message
from tests.dispatching import fast_config
from tests.store.test_partitions import DAY, service
from tests.transactions import wait_until_blocked_on_a_lock

URL = "https://example.com/orders"


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    store = Store(database_url, fast_config(retention=7 * DAY))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def age_the_carry(url: str, days: int = 8) -> None:
    """Make the generation's last carry ``days`` old, as if that much time had
    passed since (the turn waits for a retention period after it)."""
    with psycopg.connect(url) as conn:
        conn.execute(
            "UPDATE outbox.key_generation SET carried_at = now() - make_interval(days => %s)",
            (days,),
        )


def generation(url: str) -> tuple[int, int, int, int, int]:
    """The generation, and the keys and events in the current and previous tables."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT generation FROM outbox.key_generation),"
            " (SELECT count(*) FROM outbox.message_keys),"
            " (SELECT count(*) FROM outbox.message_keys_old),"
            " (SELECT count(*) FROM outbox.events),"
            " (SELECT count(*) FROM outbox.events_old)"
        ).fetchone()
    assert row is not None
    return row


def messages(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox.messages").fetchone()
    assert row is not None
    return int(row[0])


async def test_the_previous_generation_dedupes_and_the_one_before_is_dropped_whole(
    database_url: str, store: Store
) -> None:
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        Endpoints().add(conn, url="https://hooks.example.com/in")
        first = box.enqueue(conn, url=URL, idempotency_key="order-1", json={"n": 1})
        event = box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt-1")
    assert await store.turn_keys() is None  # the migration's carry is not a retention old
    age_the_carry(database_url)
    assert await store.turn_keys() == 2
    # nothing was delivered: both messages are carried, the event record is not
    while (carried := await store.carry_keys(100)) is not None and carried == 100:
        pass
    assert generation(database_url) == (2, 2, 2, 0, 1)

    with psycopg.connect(database_url) as conn:
        assert box.enqueue(conn, url=URL, idempotency_key="order-1", json={"n": 1}) == first
        assert box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt-1") == event
        # the SQL producers too (migration 0022)
        row = conn.execute(
            "SELECT outbox.enqueue(%s, 'order-1', json_body => %s)", (URL, '{"n": 1}')
        ).fetchone()
        assert row == (first,)
        row = conn.execute(
            "SELECT outbox.publish('order.paid', %s, 'evt-1')", ('{"n": 1}',)
        ).fetchone()
        assert row == (event,)
        # the messages leave the outbox (delivered and past their history)
        conn.execute("DELETE FROM outbox.messages")
    assert messages(database_url) == 0
    assert generation(database_url) == (2, 2, 2, 0, 1)

    age_the_carry(database_url)
    assert await store.turn_keys() == 3
    assert await store.carry_keys(100) == 0  # nothing left to carry
    # the first generation was dropped; the second, with the carried keys, is previous
    assert generation(database_url) == (3, 0, 2, 0, 0)
    age_the_carry(database_url)
    assert await store.turn_keys() == 4
    assert await store.carry_keys(100) == 0
    assert generation(database_url) == (4, 0, 0, 0, 0)
    with psycopg.connect(database_url) as conn:
        # gone with its generation, a key and an event key are new again
        again = box.enqueue(conn, url=URL, idempotency_key="order-1", json={"n": 1})
        republished = box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt-1")
    assert again != first
    assert republished and republished != event


async def test_the_keys_of_messages_still_in_the_outbox_are_carried_in_batches(
    database_url: str, store: Store
) -> None:
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        ids = [box.enqueue(conn, url=URL, idempotency_key=f"k{i}", json={}) for i in range(300)]
        # 50 of them left the outbox: their keys are not carried
        conn.execute("DELETE FROM outbox.messages WHERE id = ANY(%s)", (ids[100:150],))
    age_the_carry(database_url)
    partitions = service(store, batch=100, batches=2)
    await partitions.run_once()  # turns, then two full batches: the round is over
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT generation, carried_at IS NULL FROM outbox.key_generation"
        ).fetchone()
    assert row == (2, True)
    assert generation(database_url)[1] == 200
    await partitions.run_once()  # the last 50: done
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT carried_at IS NOT NULL, carried_at > now() - interval '1 minute'"
            " FROM outbox.key_generation"
        ).fetchone()
        carried = {k for (k,) in conn.execute("SELECT idempotency_key FROM outbox.message_keys")}
    assert row == (True, True)
    assert carried == {f"k{i}" for i in range(300)} - {f"k{i}" for i in range(100, 150)}
    assert await partitions.run_once() == []  # the next turn is a retention period away
    assert generation(database_url)[0] == 2

    age_the_carry(database_url)
    await partitions.run_once()  # turns, and carries the 250 forward again
    turned, _, previous, _, _ = generation(database_url)
    assert (turned, previous) == (3, 250)
    with psycopg.connect(database_url) as conn:
        # a message still waiting keeps its key; one that left long ago does not
        assert box.enqueue(conn, url=URL, idempotency_key="k0", json={}) == ids[0]
        assert box.enqueue(conn, url=URL, idempotency_key="k100", json={}) not in ids


async def test_a_message_replayed_from_the_history_keeps_its_key_across_turns(
    database_url: str, store: Store
) -> None:
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        endpoint = Endpoints().add(conn, url="https://hooks.example.com/in")
        (sent,) = box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt-1")
        # delivered: it leaves the outbox for the history, as a completion moves it
        conn.execute(
            "WITH moved AS (DELETE FROM outbox.messages WHERE id = %s RETURNING *)"
            " INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, url,"
            " method, headers, body, content_type, event_type, attempts, max_attempts,"
            " last_status, created_at, completed_at)"
            " SELECT id, idempotency_key, target, endpoint_id, url, method, headers, body,"
            " content_type, event_type, 1, max_attempts, 200, created_at, now() FROM moved",
            (sent,),
        )
    age_the_carry(database_url)
    assert await store.turn_keys() == 2
    assert await store.carry_keys(100) == 0  # nothing in the outbox: its key stays behind
    with psycopg.connect(database_url) as conn:
        assert replay_message(conn, message_id=sent) is True
    # back in the outbox; two turns later, its key is still there to dedupe
    for turn in (3, 4):
        age_the_carry(database_url)
        assert await store.turn_keys() == turn
        assert await store.carry_keys(100) == 1
    with psycopg.connect(database_url) as conn:
        # its event's record went with its generation: published again, the event
        # is recorded again, and finds the endpoint's message by its key
        assert box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt-1") == [sent]
        row = conn.execute(
            "SELECT count(*) FROM outbox.messages WHERE endpoint_id = %s", (endpoint.id,)
        ).fetchone()
    assert row == (1,)


def _library_enqueue(conn: psycopg.Connection) -> object:
    return Outbox().enqueue(conn, url=URL, idempotency_key="race", json={})


def _library_publish(conn: psycopg.Connection) -> object:
    return Outbox().publish(conn, "order.paid", {}, idempotency_key="race")


def _sql_enqueue(conn: psycopg.Connection) -> object:
    row = conn.execute("SELECT outbox.enqueue(%s, 'race', json_body => '{}')", (URL,)).fetchone()
    return row[0] if row else None


def _sql_publish(conn: psycopg.Connection) -> object:
    row = conn.execute("SELECT outbox.publish('order.paid', '{}', 'race')").fetchone()
    return row[0] if row else None


PRODUCERS: dict[str, Callable[[psycopg.Connection], object]] = {
    "library-enqueue": _library_enqueue,
    "library-publish": _library_publish,
    "sql-enqueue": _sql_enqueue,
    "sql-publish": _sql_publish,
}


@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_a_producer_held_up_by_a_turn_finds_the_key_committed_before_it(
    database_url: str, producer: str, prepared: bool
) -> None:
    produce = PRODUCERS[producer]
    with psycopg.connect(database_url, autocommit=True) as conn:
        Endpoints().add(conn, url="https://hooks.example.com/in")
    age_the_carry(database_url)
    with (
        ThreadPoolExecutor(max_workers=1) as pool,
        psycopg.connect(database_url, autocommit=True) as observer,
        psycopg.connect(database_url) as racer,
        psycopg.connect(database_url) as turner,
    ):
        if prepared:
            # the racer's statements are prepared on the server, their plans cached
            racer.prepare_threshold = 0
            produce(racer)
            racer.rollback()
        # the key is written by the transaction that then turns the generation, so
        # it commits together with the turn: a racer whose snapshot were taken
        # before the turn committed would not see it, and would write it again
        first = produce(turner)
        (turned,) = turner.execute(
            "SELECT outbox.key_generation_turn(interval '7 days')"
        ).fetchone() or (None,)
        assert turned == 2
        racing = pool.submit(produce, racer)
        wait_until_blocked_on_a_lock(observer, racer.info.backend_pid)
        turner.commit()
        again = racing.result(timeout=30)
        racer.commit()
    assert again == first
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM outbox.messages),"
            " (SELECT count(*) FROM outbox.message_keys)"
        ).fetchone()
    assert row == (1, 0)  # one message, its key in the previous generation only


def test_under_repeatable_read_a_snapshot_from_before_a_turn_is_told_to_retry(
    database_url: str,
) -> None:
    with (
        psycopg.connect(database_url) as producer,
        psycopg.connect(database_url, autocommit=True) as turner,
    ):
        producer.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        for name, produce in PRODUCERS.items():
            age_the_carry(database_url)
            producer.execute("SELECT 1")  # the transaction's snapshot is taken
            row = turner.execute("SELECT outbox.key_generation_turn(interval '7 days')")
            assert (row.fetchone() or (None,))[0] is not None
            with pytest.raises(psycopg.errors.SerializationFailure, match="try the transaction"):
                produce(producer)
            producer.rollback()
            assert produce(producer) is not None, name  # a snapshot after the turn: fine
            producer.rollback()


async def test_a_turn_behind_a_long_transaction_gives_up_at_once(
    database_url: str, store: Store
) -> None:
    age_the_carry(database_url)
    with psycopg.connect(database_url) as long:
        held = Outbox().enqueue(long, url=URL, idempotency_key="open", json={})  # and its lock
        started = time.monotonic()
        with pytest.raises((psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
            await store.turn_keys()
        waited = time.monotonic() - started
        # meanwhile other producers went on (none queued behind the turn)
        with psycopg.connect(database_url) as other:
            Outbox().enqueue(other, url=URL, idempotency_key="other", json={})
        long.commit()
    assert waited < DDL_LOCK_TIMEOUT + 1.5
    assert await store.turn_keys() == 2
    # both keys made it, and still dedupe from the previous generation
    assert generation(database_url)[1:3] == (0, 2)
    with psycopg.connect(database_url) as conn:
        assert Outbox().enqueue(conn, url=URL, idempotency_key="open", json={}) == held
