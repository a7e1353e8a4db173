"""The history's partitions (migration 0032): made ahead by every dispatcher at
once without a clash, rows of the default partition moved into the partition made
for them, partitions past the retention period dropped whole (their keys go with
their generation, tests/store/test_key_generations.py), and a drop that cannot
have its lock at once given up rather than queued in front of completions."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from dispatchers.runtime.log import NullLog
from dispatchers.runtime.maintenance import Partitions, Retention
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.postgres import DDL_LOCK_TIMEOUT, Store
from outbox import Outbox
from tests.dispatching import fast_config

DAY = 86400.0

HISTORY = """
INSERT INTO outbox.delivered (id, idempotency_key, target, url, method, headers, body,
                              content_type, attempts, max_attempts, created_at, completed_at)
SELECT g, 'h-' || g, 'https://example.com', 'https://example.com', 'POST', '{}', '',
       'text/plain', 1, 5, %(at)s, %(at)s
FROM generate_series(CAST(%(first)s AS bigint), %(last)s) AS g;
INSERT INTO outbox.message_keys (target, idempotency_key, message_id, created_at)
SELECT 'https://example.com', 'h-' || g, g, %(at)s
FROM generate_series(CAST(%(first)s AS bigint), %(last)s) AS g;
INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)
SELECT g, 1, 'someone', %(at)s, 'delivered'
FROM generate_series(CAST(%(first)s AS bigint), %(last)s) AS g
"""


def add_history(url: str, first: int, last: int, at: datetime) -> None:
    """Delivered rows ``first``..``last`` completed (and attempted) at ``at``, with
    their keys."""
    with psycopg.connect(url) as conn:
        for statement in HISTORY.strip().split(";\n"):
            conn.execute(statement, {"first": first, "last": last, "at": at})


def partitions(url: str) -> dict[str, tuple[datetime | None, datetime | None]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT partition, lower, upper FROM outbox.history_partitions()")
        return {name: (lower, upper) for name, lower, upper in rows}


def today() -> datetime:
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def add_past_days(url: str, days: int) -> None:
    """Partitions of a day for each of the ``days`` days before today, as a
    dispatcher running for that long would have made them (as the owner); a day
    that has one already keeps it (a template migrated before midnight UTC made
    what is now yesterday's)."""
    with psycopg.connect(url) as conn:
        for n in range(days, 0, -1):
            lower = today() - timedelta(days=n)
            for parent in ("delivered", "attempts"):
                made = conn.execute(
                    "SELECT EXISTS (SELECT FROM outbox.history_partitions()"
                    " WHERE parent = %s AND lower = %s)",
                    (parent, lower),
                ).fetchone()
                if made == (False,):
                    conn.execute(
                        "SELECT outbox._history_partition_add(%s, %s, %s)",
                        (parent, lower, lower + timedelta(days=1)),
                    )


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    store = Store(database_url, fast_config(retention=7 * DAY))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def service(store: Store, **settings: object) -> Partitions:
    values: dict[str, object] = {
        "interval": 60.0,
        "retention": 7 * DAY,
        "ahead": 3 * DAY,
        "step": "day",
        "batch": 100,
        "pause": 0.0,
    }
    values.update(settings)
    return Partitions(store, Reporter(NullLog()), **values)  # type: ignore[arg-type]


@pytest.mark.slow
async def test_partitions_are_made_ahead_once_while_dispatchers_make_them_together(
    database_url: str, store: Store
) -> None:
    before = partitions(database_url)
    rounds = [service(store, ahead=30 * 3600.0, step="hour") for _ in range(4)]
    await asyncio.gather(*(r.run_once() for r in rounds))
    await asyncio.gather(*(r.run_once() for r in rounds))  # whoever skipped, finds it done
    after = partitions(database_url)

    made = {name: bounds for name, bounds in after.items() if name not in before}
    # the migration made days up to three days ahead: an hour's step goes on from there
    last = max(u for _, u in before.values() if u is not None)
    assert made == {} or min(lo for lo, _ in made.values() if lo is not None) == last
    ranges = sorted(b for n, b in after.items() if n.startswith("delivered_p"))
    for (_, upper), (lower, _) in itertools.pairwise(ranges):
        assert upper == lower  # contiguous, none twice
    assert max(u for _, u in ranges if u is not None) >= datetime.now(UTC) + timedelta(hours=30)

    # an hour's step, further ahead: partitions of an hour, named with it
    await service(store, ahead=4 * DAY + 2 * 3600.0, step="hour").run_once()
    hours = [n for n in partitions(database_url) if n.startswith("delivered_p") and "_" in n[12:]]
    assert hours and all(len(n) == len("delivered_p20260101_00") for n in hours)


async def test_rows_the_default_partition_took_move_to_the_partition_made_for_them(
    database_url: str, store: Store
) -> None:
    later = today() + timedelta(days=10, hours=5)
    add_history(database_url, 1, 300, later)  # past every partition: to the default one
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT count(*) FROM outbox.delivered_default").fetchone()
    assert row == (300,)

    await service(store, ahead=12 * DAY).run_once()

    name = "delivered_p" + (later.strftime("%Y%m%d"))
    with psycopg.connect(database_url) as conn:
        counts = conn.execute(
            f"SELECT (SELECT count(*) FROM outbox.delivered_default),"
            f" (SELECT count(*) FROM outbox.{name}),"
            " (SELECT count(*) FROM outbox.attempts_default),"
            f" (SELECT count(*) FROM outbox.attempts_p{later.strftime('%Y%m%d')}),"
            " (SELECT count(*) FROM outbox.delivered)"
        ).fetchone()
    assert counts == (0, 300, 0, 300, 300)


async def test_partitions_past_retention_are_dropped_whole_and_the_rest_kept(
    database_url: str, store: Store
) -> None:
    add_past_days(database_url, 10)
    for n in range(1, 11):  # 50 rows a day, ten days back
        at = today() - timedelta(days=n) + timedelta(hours=12)
        add_history(database_url, n * 1000 + 1, n * 1000 + 50, at)
    expired_days = [today() - timedelta(days=n) for n in range(8, 11)]  # ended 7 d ago or more

    dropped = await service(store).run_once()
    assert sorted(dropped) == sorted(
        f"{parent}_p{d.strftime('%Y%m%d')}"
        for parent in ("delivered", "attempts")
        for d in expired_days
    )
    with psycopg.connect(database_url) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM outbox.delivered),"
            " (SELECT count(*) FROM outbox.attempts),"
            " (SELECT count(*) FROM outbox.message_keys),"
            " (SELECT min(id) FROM outbox.delivered)"
        ).fetchone()
        # a key outlives its history: it goes with its generation
        again = Outbox().enqueue(
            conn, url="https://example.com", idempotency_key="h-10001", json={}
        )
    assert counts == (7 * 50, 7 * 50, 10 * 50, 1001)
    assert again == 10001
    assert await service(store).run_once() == []  # nothing more is past the period


async def test_retention_deletes_rows_below_the_partitions_only(
    database_url: str, store: Store
) -> None:
    add_past_days(database_url, 9)
    # the oldest partition starts 9 days ago: what is older is the default's, and
    # goes a row at a time; what is in a partition waits for its partition
    add_history(database_url, 1, 40, today() - timedelta(days=20))
    add_history(database_url, 101, 140, today() - timedelta(days=9) + timedelta(hours=1))
    retention = Retention(store, Reporter(NullLog()), interval=60.0, batch=1000, pause=0.0)
    assert await retention.run_once() == 40
    with psycopg.connect(database_url) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM outbox.delivered_default),"
            " (SELECT count(*) FROM outbox.attempts_default),"
            " (SELECT count(*) FROM outbox.message_keys WHERE message_id <= 40),"
            " (SELECT count(*) FROM outbox.delivered)"
        ).fetchone()
    # the keys stay: they go with their generation
    assert counts == (0, 0, 40, 40)


async def test_a_drop_behind_a_long_reader_gives_up_at_once_and_is_tried_next_round(
    database_url: str, store: Store
) -> None:
    add_past_days(database_url, 9)
    with psycopg.connect(database_url) as reader:
        reader.execute("SELECT count(*) FROM outbox.delivered")  # holds its lock until rollback
        started = time.monotonic()
        # the lock wait ends it, or the statement's own timeout if that is shorter
        with pytest.raises((psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
            await service(store).run_once()
        waited = time.monotonic() - started
        # meanwhile, writes through the parent went on (none queued behind a drop)
        with psycopg.connect(database_url) as writer:
            add_history(database_url, 1, 10, datetime.now(UTC))
            writer.execute("SELECT 1")
        reader.rollback()
    assert waited < DDL_LOCK_TIMEOUT + 1.5
    assert len(await service(store).run_once()) == 4  # days 9 and 8, both tables


async def test_a_dead_messages_attempts_go_with_their_partition_and_it_keeps_its_outcome(
    database_url: str, store: Store
) -> None:
    add_past_days(database_url, 9)
    with psycopg.connect(database_url) as conn:
        dead = Outbox().enqueue(conn, url="https://example.com/x", idempotency_key="d", json={})
        conn.execute(
            "UPDATE outbox.messages SET state = 'dead', attempts = 2, last_status = 500,"
            " last_error = 'HTTP 500', completed_at = now() - interval '8 days' WHERE id = %s",
            (dead,),
        )
        conn.execute(
            "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)"
            " VALUES (%s, 1, 'someone', %s, 'retry'), (%s, 2, 'someone', %s, 'failed')",
            (dead, today() - timedelta(days=9), dead, today() - timedelta(days=1)),
        )
    await service(store).run_once()
    with psycopg.connect(database_url) as conn:
        kept = conn.execute(
            "SELECT array_agg(CAST(attempt AS integer) ORDER BY attempt)"
            " FROM outbox.attempts WHERE message_id = %s",
            (dead,),
        ).fetchone()
        message = conn.execute(
            "SELECT state, attempts, last_status, last_error FROM outbox.messages WHERE id = %s",
            (dead,),
        ).fetchone()
    # the attempt of 9 days ago went with its day; the message says how it ended
    assert kept == ([2],)
    assert message == ("dead", 2, 500, "HTTP 500")


async def test_rescue_records_each_lost_attempt_once_without_an_arbiter_index(
    database_url: str, store: Store
) -> None:
    """attempts has no unique index across its partitions, so rescue checks for
    the row instead of ON CONFLICT: a row already there (written by someone else)
    stops neither the rescue nor the recording of the other lost attempts."""
    with psycopg.connect(database_url) as conn:
        box = Outbox()
        ids = [
            box.enqueue(conn, url="https://example.com/x", idempotency_key=k, json={})
            for k in ("stray", "plain")
        ]
        conn.execute(
            "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'gone',"
            " lease_until = now() - interval '1 second' WHERE id = ANY(%s)",
            (ids,),
        )
        conn.execute(
            "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)"
            " VALUES (%s, 1, 'gone', now() - interval '2 days', 'lease_expired')",
            (ids[0],),
        )
    assert sorted(await store.rescue()) == [(ids[0], "ready"), (ids[1], "ready")]
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT message_id, count(*) FROM outbox.attempts GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert rows == [(ids[0], 1), (ids[1], 1)]
