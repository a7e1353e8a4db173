"""The backlog gauges: ready messages due per destination, read from the database
into /metrics, bounded in labels, and served by a running dispatcher."""

from __future__ import annotations

import asyncio
import threading

import httpx
import psycopg
import pytest

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from dispatchers.runtime.maintenance import BacklogGauge
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.postgres import Store
from dispatchers.store.statements import store_queries
from outbox import Outbox
from tests.dispatching import fast_config, wait_until
from tests.library.test_autoscaling import copy_message
from tests.receiver import Received, Receiver, Reply
from tests.runtime.test_metrics import sample


def enqueue(conn: psycopg.Connection[tuple[object, ...]], origin: str, count: int) -> None:
    for i in range(count):
        Outbox().enqueue(conn, url=f"{origin}/hook", idempotency_key=f"{origin}-{i}", json={})


async def test_the_backlog_names_the_busiest_destinations_and_sums_the_rest(
    database_url: str,
) -> None:
    with psycopg.connect(database_url) as conn:
        enqueue(conn, "https://a.example", 5)
        enqueue(conn, "https://b.example", 3)
        enqueue(conn, "https://c.example", 2)
        enqueue(conn, "https://d.example", 1)
        enqueue(conn, "https://blocked.example", 4)  # a hold: nothing of it is due
        enqueue(conn, "https://later.example", 6)  # scheduled later: not due
        conn.execute(
            "UPDATE outbox.messages SET available_at = now() + interval '1 hour'"
            " WHERE destination = 'https://later.example:443'"
        )
        conn.execute(
            "UPDATE outbox.messages SET available_at = now() - interval '90 seconds'"
            " WHERE idempotency_key = 'https://a.example-0'"
        )
        conn.execute(
            "INSERT INTO outbox.destination_health (destination, state, blocked_until, reason)"
            " VALUES ('https://blocked.example:443', 'held', now() + interval '1 hour', 'test')"
        )
    reporter = Reporter(NullLog())
    store = Store(database_url, fast_config())
    await store.open()
    try:
        gauge = BacklogGauge(store, reporter, interval=60.0, top=2)
        assert await gauge.run_once() == 11
    finally:
        await store.close()
    text = reporter.metrics.render().decode()
    ready = {
        name: sample(text, "outbox_messages_ready", f'{{destination="{name}"}}')
        for name in ("https://a.example:443", "https://b.example:443", "(other)")
    }
    assert ready == {"https://a.example:443": 5, "https://b.example:443": 3, "(other)": 3}
    assert "blocked.example" not in text
    assert "later.example" not in text
    assert "c.example" not in text  # summed in (other)
    oldest = sample(text, "outbox_oldest_ready_seconds", '{destination="https://a.example:443"}')
    assert 90 <= oldest < 600


async def test_a_dispatcher_serving_metrics_reports_the_backlog_and_clears_it_when_sent(
    database_url: str,
) -> None:
    release = threading.Event()

    def held(request: Received) -> Reply:
        release.wait(30)  # the receiver holds every request until released
        return Reply()

    with Receiver(held) as receiver:
        with psycopg.connect(database_url) as conn:
            for i in range(4):
                Outbox().enqueue(conn, url=receiver.url, idempotency_key=f"m{i}", json={})
            (destination,) = conn.execute(
                "SELECT DISTINCT destination FROM outbox.messages"
            ).fetchone()
        config = fast_config(metrics_port=0, backlog_interval=0.05, concurrency=1)
        dispatcher = Dispatcher(database_url, config, log=NullLog())
        task = asyncio.create_task(dispatcher.run())
        try:
            await wait_until(lambda: dispatcher.metrics_server is not None)
            assert dispatcher.metrics_server is not None
            port = dispatcher.metrics_server.sockets[0].getsockname()[1]
            async with httpx.AsyncClient() as client:

                async def ready() -> float:
                    text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
                    labels = f'{{destination="{destination}"}}'
                    return sample(text, "outbox_messages_ready", labels, absent=0.0)

                async def reads(value: float) -> bool:
                    for _ in range(400):  # 20 s at most
                        if await ready() == value:
                            return True
                        await asyncio.sleep(0.05)
                    return False

                # one request held at the receiver, three waiting: due, ready
                assert await reads(3.0), await ready()
                release.set()
                assert await reads(0.0), await ready()
        finally:
            release.set()
            dispatcher.stop()
            await task


async def test_each_destination_is_counted_up_to_the_cap(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        enqueue(conn, "https://a.example", 5)
        enqueue(conn, "https://b.example", 2)
    store = Store(database_url, fast_config())
    await store.open()
    try:
        rows = await store.backlog(top=5, cap=3)
    finally:
        await store.close()
    assert sorted((r.destination, r.ready) for r in rows) == [
        ("https://a.example:443", 3),
        ("https://b.example:443", 2),
    ]


@pytest.mark.slow
def test_the_backlog_walks_the_claimable_index_not_the_table(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for origin in ("https://a.example", "https://b.example"):
            Outbox().enqueue(conn, url=f"{origin}/x", idempotency_key=origin, json={})
        copy_message(conn, count=5_000, state="ready")
        copy_message(conn, count=5_000, state="dead")
        conn.execute("ANALYZE outbox.messages")
        plan = "\n".join(
            str(r[0])
            for r in conn.execute(
                "EXPLAIN " + store_queries("outbox")["backlog"].text, {"top": 20, "cap": 10_000}
            )
        )
    assert "messages_claimable_idx" in plan, plan
    assert "Seq Scan on messages" not in plan, plan
