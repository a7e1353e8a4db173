"""Retention removes old history in bounded batches; the claim never looks at it."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from dispatchers.runtime.maintenance import Retention
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.postgres import Store
from outbox import Outbox
from tests.dispatching import fast_config, wait_until

HISTORY = """
INSERT INTO outbox.delivered (id, idempotency_key, target, url, method, headers, body,
                              content_type, attempts, max_attempts, created_at, completed_at)
SELECT g, 'old-' || g, 'https://example.com', 'https://example.com', 'POST', '{}', '',
       'text/plain', 1, 5, now() - %(age)s::interval, now() - %(age)s::interval
FROM generate_series(%(first)s, %(last)s) AS g;
INSERT INTO outbox.message_keys (target, idempotency_key, message_id, created_at)
SELECT 'https://example.com', 'old-' || g, g, now() - %(age)s::interval
FROM generate_series(%(first)s, %(last)s) AS g;
INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)
SELECT g, 1, 'someone', now() - %(age)s::interval, 'delivered'
FROM generate_series(%(first)s, %(last)s) AS g;
"""


def add_history(
    conn: psycopg.Connection[tuple[object, ...]], first: int, last: int, age: str
) -> None:
    for statement in HISTORY.strip().split(";\n"):
        conn.execute(statement, {"first": first, "last": last, "age": age})


async def test_history_past_retention_is_removed_in_batches_and_the_rest_kept(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        add_history(conn, 1_000_001, 1_002_500, "8 days")  # expired
        add_history(conn, 2_000_001, 2_000_100, "6 days")  # kept
        # the rows here are older than every partition of the template's history
        # (the default partition's): retention's batches remove a delivered
        # message's attempts with it, never a dead message's, whose attempts go
        # only with their partition (tests/store/test_partitions.py)
        dead = Outbox().enqueue(conn, url="https://example.com/x", idempotency_key="dead", json={})
        conn.execute(
            "UPDATE outbox.messages SET state = 'dead', attempts = 1,"
            " completed_at = now() - interval '30 days' WHERE id = %s",
            (dead,),
        )
        conn.execute(
            "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)"
            " VALUES (%s, 1, 'someone', now() - interval '30 days', 'failed')",
            (dead,),
        )
    cfg = fast_config(retention=7 * 86400.0, retention_interval=0.1, retention_batch=1000)
    dispatcher = Dispatcher(database_url, cfg, log=NullLog())
    task = asyncio.create_task(dispatcher.run())
    try:
        await wait_until(lambda: dispatcher.stats.history_removed == 2500, seconds=20)
    finally:
        dispatcher.stop()
        await task
    with psycopg.connect(database_url) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM outbox.delivered),"
            " (SELECT count(*) FROM outbox.message_keys),"
            " (SELECT count(*) FROM outbox.attempts),"
            " (SELECT min(id) FROM outbox.delivered)"
        ).fetchone()
    # 100 recent history rows and their attempts; the dead message and its attempt
    # row; every key: keys go a generation at a time (tests/store/test_key_generations.py)
    assert counts == (100, 2_601, 101, 2_000_001)
    # so a key whose history expired still names its message (a key written
    # before digests were kept accepts any request)
    with psycopg.connect(database_url) as conn:
        again = Outbox().enqueue(
            conn, url="https://example.com", idempotency_key="old-1000001", json={}
        )
    assert again == 1_000_001


@pytest.mark.slow
def test_claim_plan_ignores_a_large_history(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        add_history(conn, 10_000_001, 10_200_000, "1 day")
        for i in range(50):
            Outbox().enqueue(conn, url="https://example.com/x", idempotency_key=f"k{i}", json={})
        conn.execute("ANALYZE outbox.delivered")
        conn.execute("ANALYZE outbox.messages")
        claim, params = Store(database_url, fast_config()).claim_statement("o", 10, capped=True)
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + claim.text, params))
    assert "delivered" not in plan
    assert "messages_claimable_idx" in plan or "Seq Scan on messages" in plan, plan


async def test_retention_removes_old_history_in_bounded_batches(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        add_history(conn, 1_000_001, 1_000_250, "8 days")  # past the 7 days kept
        add_history(conn, 2_000_001, 2_000_010, "6 days")
    reporter = Reporter(NullLog())
    store = Store(database_url, fast_config(retention=7 * 86400.0))
    await store.open()
    try:
        retention = Retention(store, reporter, interval=60.0, batch=100, batches=2, pause=0.0)
        assert await retention.run_once() == 200  # two full batches: the round is over
        assert await retention.run_once() == 50
    finally:
        await store.close()

    assert reporter.stats.history_removed == 250
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT min(id), count(*) FROM outbox.delivered").fetchone()
    assert row == (2_000_001, 10)
