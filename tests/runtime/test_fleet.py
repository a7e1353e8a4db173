"""One process serving several databases (here, schemas of the test's database):
each is served, labelled in logs and metrics, and a backlog in one does not hold
back another's messages, though they share the process's request slots."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence

import httpx
import psycopg
import pytest

from dispatchers.cli import main
from dispatchers.errors import DispatcherFailed
from dispatchers.runtime.databases import Served, default_label
from dispatchers.runtime.fleet import Fleet
from dispatchers.runtime.log import EventLog
from outbox import Outbox
from outbox.migrations import migrate
from tests.dispatching import fast_config
from tests.receiver import Received, Receiver, Reply
from tests.runtime.test_fairness import Holding
from tests.runtime.test_metrics import sample
from tests.waiting import until


def enqueue(url: str, schema: str, target: str, keys: Sequence[str]) -> None:
    box = Outbox(schema=schema)
    with psycopg.connect(url) as conn, conn.transaction():
        for key in keys:
            box.enqueue(conn, url=target, idempotency_key=key, json={"key": key})


def keys_of(requests: Sequence[Received]) -> Counter[str]:
    return Counter(r.headers["idempotency-key"].strip('"') for r in requests)


def schemas(url: str, *names: str) -> list[Served]:
    """The test's database in the default schema and in each of ``names``."""
    for name in names:
        migrate(url, schema=name)
    return [Served(url, s, default_label(url, s)) for s in ("outbox", *names)]


@pytest.mark.slow
async def test_each_database_is_served_and_labelled_in_logs_and_metrics(
    database_url: str,
) -> None:
    databases = schemas(database_url, "east", "west")
    out = io.StringIO()
    fleet = Fleet(databases, fast_config(metrics_port=0), log=EventLog(stream=out, format="json"))
    with Receiver() as receiver:
        for db in databases:
            enqueue(db.url, db.schema, receiver.url, [f"{db.schema}-{i}" for i in range(5)])
        task = asyncio.create_task(fleet.run())
        try:
            await until(lambda: len(receiver.requests) >= 15, "every message delivered")
            await until(
                lambda: all(
                    m.dispatcher and m.dispatcher.stats.delivered == 5 for m in fleet.members
                ),
                "every outcome recorded",
            )
            assert fleet.metrics_server is not None
            port = fleet.metrics_server.sockets[0].getsockname()[1]
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                metrics = (await client.get("/metrics")).text
                health = await client.get("/healthz")
        finally:
            fleet.stop()
            await asyncio.wait_for(task, 15)
    assert keys_of(receiver.requests) == {
        f"{s}-{i}": 1 for s in ("outbox", "east", "west") for i in range(5)
    }
    for db in databases:
        labels = f'{{database="{db.label}",outcome="delivered"}}'
        assert sample(metrics, "outbox_deliveries_total", labels) == 5
        assert sample(metrics, "outbox_database_up", f'{{database="{db.label}"}}') == 1
    assert metrics.count("# TYPE outbox_deliveries_total counter") == 1  # one family
    assert health.status_code == 200
    assert health.text == "".join(f"ok {db.label}\n" for db in databases)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    delivered = Counter(e["database"] for e in events if e["event"] == "delivered")
    assert delivered == {db.label: 5 for db in databases}
    started = [e for e in events if e["event"] == "started"]
    assert sorted(e["database"] for e in started) == sorted(db.label for db in databases)
    assert [e["shares"] for e in events if e["event"] == "fleet_started"] == [[3, 3, 2]]


SLOW = 0.05
"""Seconds the receiver takes per request: slow enough that the backlog lasts."""


def database_of(request: Received) -> str:
    """``big`` or ``small``: the prefix of the request's idempotency key."""
    return request.headers["idempotency-key"].strip('"').partition("-")[0]


class Concurrent:
    """A responder that answers each request after :data:`SLOW`, counting each
    database's requests it holds at once and the most it held."""

    def __init__(self) -> None:
        self.held: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, request: Received) -> Reply:
        database = database_of(request)
        with self._lock:
            self.held[database] += 1
            self.peak[database] = max(self.peak[database], self.held[database])
        time.sleep(SLOW)  # the receiver's own pace, not a wait for a condition
        with self._lock:
            self.held[database] -= 1
        return Reply()


@pytest.mark.slow
async def test_a_backlog_in_one_database_does_not_hold_back_another(database_url: str) -> None:
    # 8 request slots, 4 for each database. The big one borrows the small one's
    # idle slots for its backlog; once the small one wants slots, those the big
    # one gives back go to it, and each then has its 4 requests out at once: the
    # receiver sees the two databases' requests interleaved about one for one
    # (some 15 to 25 of the backlog's among the small one's 16), and never more
    # than 4 of the small one's at once. Held back to its reserve of one slot, the
    # small one's 16 would go out one by one among some 110 of the backlog's.
    big, small = schemas(database_url, "small")
    config = fast_config(concurrency=8, batch_size=8)
    concurrent = Concurrent()
    with Receiver(concurrent) as receiver:
        enqueue(database_url, big.schema, receiver.url, [f"big-{i}" for i in range(800)])
        fleet = Fleet([big, small], config, log=EventLog(stream=io.StringIO()))
        task = asyncio.create_task(fleet.run())
        try:
            await until(lambda: len(receiver.requests) >= 40, "the backlog being sent")
            enqueue(database_url, small.schema, receiver.url, [f"small-{i}" for i in range(16)])

            def small_done() -> bool:
                return sum(k.startswith("small-") for k in keys_of(receiver.requests)) == 16

            await until(small_done, "the small database's messages delivered", within=30)
        finally:
            fleet.stop()
            await asyncio.wait_for(task, 15)
    arrived = [database_of(r) for r in receiver.requests]
    first, last = arrived.index("small"), len(arrived) - arrived[::-1].index("small")
    among = arrived[first:last].count("big")
    assert among <= 40, f"{among} of the backlog's requests among the small database's 16"
    assert concurrent.peak["small"] <= 4, (
        f"the small database had {concurrent.peak['small']} requests out at once, past its "
        "share of 4, while the backlog wanted slots"
    )


@pytest.mark.slow
async def test_a_database_gets_its_reserve_while_another_holds_every_other_slot(
    database_url: str,
) -> None:
    # The big database's receiver holds every request until the test ends: a
    # process whose slots went first come, first served would never send the
    # small database's messages. Its reserve (a quarter of its share) is its own.
    big, small = schemas(database_url, "small")
    config = fast_config(concurrency=16, request_timeout=20.0, lease=40.0, grace=0)
    hanging = Holding(seconds=30.0)
    with Receiver(hanging) as stuck, Receiver() as healthy:
        enqueue(database_url, big.schema, stuck.url, [f"big-{i}" for i in range(100)])
        fleet = Fleet([big, small], config, log=EventLog(stream=io.StringIO()))
        task = asyncio.create_task(fleet.run())
        try:
            await until(lambda: hanging.held == 14, "the big database holding all but 2 slots")
            enqueue(database_url, small.schema, healthy.url, [f"small-{i}" for i in range(10)])
            await until(lambda: len(healthy.requests) == 10, "the small database's messages sent")
            assert hanging.peak == 14  # it never took the small one's reserve
        finally:
            hanging.release()
            fleet.stop()
            await asyncio.wait_for(task, 15)


def test_a_database_not_migrated_fails_the_start_naming_it(
    database_url: str, empty_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["dispatch", "--database-url", database_url, "--database-url", empty_database_url])
    err = capsys.readouterr().err
    label = default_label(empty_database_url, "outbox")
    assert code == 1
    assert f'outbox dispatch: {label}: schema "outbox" does not exist' in err, err
    assert default_label(database_url, "outbox") not in err  # the other one is fine


@pytest.mark.slow
async def test_a_failed_database_is_served_again_and_the_process_fails_only_once_all_have(
    database_url: str,
) -> None:
    # A dropped schema is a permanent error: after a lease of them a database's
    # dispatcher fails. The other goes on; once both have failed, the fleet does.
    databases = schemas(database_url, "east")
    out = io.StringIO()
    fleet = Fleet(databases, fast_config(), log=EventLog(stream=out, format="json"))
    task = asyncio.create_task(fleet.run())
    try:
        await until(
            lambda: all(m.dispatcher and m.dispatcher.stats.claims for m in fleet.members),
            "both databases claimed",
        )
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA east CASCADE")
        east = fleet.members[1]
        await until(lambda: "database_restarting" in out.getvalue(), "east started again", 30)
        assert east.down and not task.done()
        assert fleet.health_text() == f"ok {databases[0].label}\nfailed {east.label}\n".encode()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DROP SCHEMA outbox CASCADE")
        with pytest.raises(DispatcherFailed, match="every database failed"):
            await asyncio.wait_for(task, 60)
    finally:
        fleet.stop()
        with contextlib.suppress(DispatcherFailed):
            await asyncio.wait_for(task, 30)
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    restarts = [e for e in events if e["event"] == "database_restarting"]
    assert {e["database"] for e in restarts} == {east.label}
    assert any(e["event"] == "fleet_failed" for e in events)
