"""Destination health across dispatchers: a failing destination's circuit breaker
opens, its messages wait with their attempts unspent while others are delivered,
one probe goes out after the back-off, and the breaker closes once the receiver
recovers; a 429 with Retry-After holds its destination for every dispatcher.

Each receiver listens on its own port of 127.0.0.1: its own destination."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from typing import Any

import psycopg
import pytest

from dispatchers.cli import main
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog
from dispatchers.store.postgres import Store
from dispatchers.store.rows import HealthRow
from outbox import Outbox
from outbox.admin import status
from outbox.endpoints import Endpoints
from tests.database import Db
from tests.dispatching import fast_config, retried, running, wait_until
from tests.receiver import Received, Receiver, Reply

BREAKER = {
    "breaker_window": 30.0,
    "breaker_min_attempts": 4,
    "breaker_failure_ratio": 0.5,
    "breaker_backoff": 1.0,
    "breaker_backoff_max": 2.0,
}
"""A breaker that opens after four failed attempts and probes a second later:
long enough for the test to see it open and its messages wait."""


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


def _events(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def _health(db: Db, destination: str) -> tuple[Any, ...] | None:
    rows = db.query(
        "SELECT state, failed_probes FROM outbox.destination_health WHERE destination = %s",
        destination,
    )
    return rows[0] if rows else None


def _attempts(db: Db, destination: str) -> int:
    return db.query(
        "SELECT COALESCE(sum(attempts), 0) FROM outbox.messages WHERE destination = %s",
        destination,
    )[0][0]


def _status(db: Db) -> list[dict[str, Any]]:
    """The open breakers and holds ``outbox.admin.status`` reports."""
    with psycopg.connect(db.url) as conn:
        health: list[dict[str, Any]] = status(conn)["destination_health"]
        return health


async def _poll(predicate: Any, seconds: float = 15.0) -> None:
    """:func:`wait_until` of a predicate that queries the database (in a thread)."""
    deadline = time.monotonic() + seconds
    while not await asyncio.to_thread(predicate):
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_failing_destination_opens_its_breaker_probes_and_closes(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    recovered = threading.Event()

    def failing_until_recovered(req: Received) -> Reply:
        return Reply() if recovered.is_set() else Reply(status=503)

    with Receiver(failing_until_recovered) as failing, Receiver() as healthy:
        for i in range(10):
            db.enqueue(f"down-{i}", failing.url, max_attempts=50)
        destination = db.query("SELECT DISTINCT destination FROM outbox.messages")[0][0]
        # one request at a time: once the breaker is written open, nothing is in
        # flight to the failing destination, so every later request is a probe
        config = fast_config(BREAKER, concurrency=1)
        stream = io.StringIO()
        async with running(db, config, log=EventLog(stream=stream, format="json")) as dispatcher:
            await _poll(lambda: _health(db, destination) == ("open", 0))
            sent_when_opened = len(failing.requests)
            attempts_when_opened = _attempts(db, destination)
            assert sent_when_opened == 4  # the four that opened it

            # open: shown by outbox status, a line and in --json
            snapshot = await asyncio.to_thread(_status, db)
            assert [(d["destination"], d["state"]) for d in snapshot] == [(destination, "open")]
            assert main(["status", "--database-url", db.url]) == 0
            assert f"breaker open: {destination}, next probe at" in capsys.readouterr().out

            # another destination is served meanwhile
            for i in range(3):
                db.enqueue(f"up-{i}", healthy.url)
            await asyncio.to_thread(healthy.wait_for, 3)

            # after the back-off, one probe: it fails and the breaker opens again
            await _poll(lambda: _health(db, destination) == ("open", 1))
            assert len(failing.requests) == sent_when_opened + 1
            assert _attempts(db, destination) == attempts_when_opened + 1

            # the receiver recovers: the next probe closes it, and the backlog drains
            recovered.set()
            await _poll(lambda: _attempts(db, destination) == 0)
            assert _health(db, destination) is None
            metrics = dispatcher.metrics.registry
            counts = {
                t: metrics.get_sample_value(
                    "outbox_destination_health_transitions_total", {"transition": t}
                )
                for t in ("opened", "probing", "reopened", "closed")
            }
    assert counts == {"opened": 1.0, "probing": 2.0, "reopened": 1.0, "closed": 1.0}
    assert len(failing.requests) == sent_when_opened + 1 + 10  # one failed probe, then all
    transitions = [e["event"] for e in _events(stream) if e["event"].startswith("breaker_")]
    assert transitions == [
        "breaker_opened",
        "breaker_probing",
        "breaker_reopened",
        "breaker_probing",
        "breaker_closed",
    ]


@pytest.mark.slow
async def test_a_retry_after_holds_the_destination_for_every_dispatcher(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    arrived: list[float] = []  # wall-clock times, comparable with the database's

    def limited_once(req: Received) -> Reply:
        arrived.append(time.time())
        if len(arrived) == 1:
            return Reply(status=429, headers={"Retry-After": "2"})
        return Reply()

    with Receiver(limited_once) as receiver:
        db.enqueue("first", receiver.url)
        destination = db.query("SELECT DISTINCT destination FROM outbox.messages")[0][0]
        config = fast_config()
        stream = io.StringIO()
        log = EventLog(stream=stream, format="json")
        async with running(db, config, log=log) as one, running(db, config, log=log) as two:

            def held() -> list[float | None]:
                return [
                    d.metrics.registry.get_sample_value(
                        "outbox_destination_health_transitions_total", {"transition": "held"}
                    )
                    for d in (one, two)
                ]

            # the holder counts the hold once its write has returned: after the row
            # is visible here, so wait for both
            await _poll(lambda: _health(db, destination) == ("held", 0) and 1.0 in held())
            (until,) = db.query(
                "SELECT extract(epoch FROM blocked_until) FROM outbox.destination_health"
            )[0]
            # held: a line of outbox status, and counted once, by the one that held it
            assert main(["status", "--database-url", db.url]) == 0
            assert f"held: {destination} until " in capsys.readouterr().out
            assert sorted(held(), key=lambda v: v or 0.0) in ([None, 1.0], [0.0, 1.0])
            for i in range(4):
                db.enqueue(f"later-{i}", receiver.url)
            await asyncio.to_thread(receiver.wait_for, 6, 15)
            await wait_until(lambda: not db.query("SELECT 1 FROM outbox.messages"))
        attempts = db.query("SELECT attempts FROM outbox.delivered ORDER BY id")
    # nothing reached the destination before the hold ended, from either dispatcher
    assert all(at >= float(until) for at in arrived[1:])
    # the held messages spent no attempt; the one answered 429 spent two
    assert [a for (a,) in attempts] == [2, 1, 1, 1, 1]
    assert [e["event"] for e in _events(stream)].count("destination_held") == 1


@pytest.mark.parametrize("state", ["held", "open"])
@pytest.mark.slow
async def test_a_drain_ends_leaving_a_blocked_destinations_messages_waiting(
    db: Db, state: str
) -> None:
    with Receiver() as blocked, Receiver() as served:
        db.enqueue("blocked", blocked.url)
        db.enqueue("served", served.url)
        db.query(
            "INSERT INTO outbox.destination_health (destination, state, blocked_until, opened_at)"
            " SELECT destination, %s, now() + interval '1 minute',"
            "        CASE WHEN %s = 'open' THEN now() END"
            " FROM outbox.messages WHERE idempotency_key = 'blocked' RETURNING 1",
            state,
            state,
        )
        stream = io.StringIO()
        dispatcher = Dispatcher(db.url, fast_config(), log=EventLog(stream=stream, format="json"))
        async with asyncio.timeout(15):
            await dispatcher.run(drain=True)
    assert (len(blocked.requests), len(served.requests)) == (0, 1)
    assert db.query("SELECT idempotency_key, attempts, state FROM outbox.messages") == [
        ("blocked", 0, "ready")
    ]
    (drained,) = [e for e in _events(stream) if e["event"] == "drained"]
    assert drained["scheduled_later"] == 1


async def test_of_two_concurrent_claims_one_takes_the_probe_of_one_message(db: Db) -> None:
    # an open breaker past its back-off, a backlog behind it, a healthy
    # destination beside it, and two dispatchers claiming at once (the one told
    # it was alone too): one probe goes out, the rest waits
    probed = [db.enqueue(f"down-{i}", "https://down.example/x") for i in range(5)]
    healthy = [db.enqueue(f"up-{i}", "https://up.example/x") for i in range(4)]
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until, opened_at)"
        " VALUES ('https://down.example:443', 'open', now() - interval '1 second', now())"
        " RETURNING 1"
    )
    stores = [Store(db.url, fast_config(destination_concurrency=100)) for _ in range(2)]
    for store in stores:
        await store.open()
    try:
        batches = await asyncio.gather(
            stores[0].claim("first", 10),
            stores[1].claim("second", 10, alone="https://down.example:443"),
        )
        again = (await stores[0].claim("first", 10)).messages
    finally:
        for store in stores:
            await store.close()
    jobs = [job for batch in batches for job in batch.messages]
    probes = [job for job in jobs if job.probe]
    assert [job.id for job in probes] == [probed[0]]
    assert sorted(job.id for job in jobs if not job.probe) == healthy
    assert again == []
    owner = "first" if probes[0] in batches[0].messages else "second"
    assert db.query(
        "SELECT state, probe_owner, blocked_until > now() FROM outbox.destination_health"
    ) == [("probing", owner, True)]


async def test_without_holds_a_retry_after_delays_only_its_message(db: Db) -> None:
    def limited_once(req: Received) -> Reply:
        if json.loads(req.body)["key"] == "first":
            return Reply(status=429, headers={"Retry-After": "30"})
        return Reply()

    with Receiver(limited_once) as receiver:
        db.enqueue("first", receiver.url)
        config = fast_config(retry_after_holds=False)
        stream = io.StringIO()
        async with running(db, config, log=EventLog(stream=stream, format="json")):
            await asyncio.to_thread(receiver.wait_for, 1)
            for i in range(3):
                db.enqueue(f"later-{i}", receiver.url)
            await asyncio.to_thread(receiver.wait_for, 4)
    assert db.query("SELECT idempotency_key FROM outbox.messages") == [("first",)]
    assert db.query("SELECT 1 FROM outbox.destination_health") == []
    assert "destination_held" not in [e["event"] for e in _events(stream)]


async def test_failed_probes_in_a_row_double_the_back_off_up_to_its_cap(db: Db) -> None:
    destination = "https://down.example:443"
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until, opened_at)"
        " VALUES (%s, 'open', now(), now()) RETURNING 1",
        destination,
    )
    store = Store(db.url, fast_config())
    await store.open()

    async def reopen(hold_s: float) -> HealthRow | None:
        """A failed probe of owner me: 10 s of back-off, doubled per failure, 70 s at most."""
        return await store.health(
            "health_reopen",
            destination=destination,
            owner="me",
            backoff_s=10.0,
            backoff_max_s=70.0,
            hold_s=hold_s,
        )

    blocked = []
    try:
        for _ in range(5):
            # the probe is ours (as a claim makes it), then it fails
            db.query(
                "UPDATE outbox.destination_health SET state = 'probing', probe_owner = 'me'"
                " WHERE destination = %s RETURNING 1",
                destination,
            )
            row = await reopen(hold_s=0.0)
            assert row is not None and row.state == "open"
            ((seconds, failed),) = db.query(
                "SELECT extract(epoch FROM blocked_until - now()), failed_probes"
                " FROM outbox.destination_health WHERE destination = %s",
                destination,
            )
            blocked.append((round(float(seconds) / 10) * 10, failed))
        # a probe whose lease another owner took changes nothing
        db.query(
            "UPDATE outbox.destination_health SET state = 'probing', probe_owner = 'other'"
            " WHERE destination = %s RETURNING 1",
            destination,
        )
        assert await reopen(hold_s=0.0) is None
        # a Retry-After the probe was answered with outlasts the back-off
        db.query(
            "UPDATE outbox.destination_health SET probe_owner = 'me' WHERE destination = %s"
            " RETURNING 1",
            destination,
        )
        await reopen(hold_s=600.0)
        ((held,),) = db.query(
            "SELECT extract(epoch FROM blocked_until - now())"
            " FROM outbox.destination_health WHERE destination = %s",
            destination,
        )
    finally:
        await store.close()
    # twice as long after each failed probe, from twice the back-off, up to the cap
    assert blocked == [(20, 1), (40, 2), (70, 3), (70, 4), (70, 5)]
    assert 590 < float(held) <= 600


async def test_a_probe_whose_dispatcher_vanished_is_taken_again_once_its_lease_passed(
    db: Db,
) -> None:
    destination = "https://down.example:443"
    waiting = [db.enqueue(f"down-{i}", "https://down.example/x") for i in range(3)]
    db.query(
        "INSERT INTO outbox.destination_health"
        " (destination, state, blocked_until, opened_at, probe_owner)"
        " VALUES (%s, 'probing', now() + interval '1 hour', now(), 'gone') RETURNING 1",
        destination,
    )
    store = Store(db.url, fast_config(destination_concurrency=100))
    await store.open()
    try:
        assert (await store.claim("me", 10)).messages == []  # its prober's lease still runs
        db.query(
            "UPDATE outbox.destination_health SET blocked_until = now() - interval '1 second'"
            " WHERE destination = %s RETURNING 1",
            destination,
        )
        (job,) = (await store.claim("me", 10)).messages  # one probe, taken over
    finally:
        await store.close()
    assert job.probe and job.id == waiting[0]
    assert db.query(
        "SELECT state, probe_owner, blocked_until > now() FROM outbox.destination_health"
    ) == [("probing", "me", True)]


async def test_a_failed_probe_extends_its_endpoints_failure_streak(db: Db) -> None:
    # waiting does not heal an endpoint: only a success clears its streak, so a
    # probe that fails counts as the failure it is
    box = Outbox()
    with psycopg.connect(db.url) as conn:
        endpoint = Endpoints().add(conn, url="https://down.example/hook")
        box.publish(conn, "order.paid", {"n": 1})
    destination = f"endpoint:{endpoint.id}"
    db.query(
        "UPDATE outbox.endpoints SET failure_streak = 4, failing_since = now()"
        " WHERE id = %s RETURNING 1",
        endpoint.id,
    )
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until, opened_at)"
        " VALUES (%s, 'open', now() - interval '1 second', now()) RETURNING 1",
        destination,
    )
    store = Store(db.url, fast_config())
    await store.open()
    try:
        (probe,) = (await store.claim("me", 10)).messages
        assert probe.probe
        failed = retried(probe.id, probe.attempts, endpoint_id=endpoint.id)
        assert (await store.complete("me", [failed]))[0] == {probe.id}
    finally:
        await store.close()
    assert db.query(
        "SELECT failure_streak, failing_since IS NOT NULL FROM outbox.endpoints WHERE id = %s",
        endpoint.id,
    ) == [(5, True)]


async def test_a_probe_that_never_reached_its_destination_gives_its_turn_back(db: Db) -> None:
    # The SSRF guard refuses both messages before any request: a refused probe
    # says nothing of the destination's health, so it neither closes the breaker
    # (the next message would then be sent as if it had recovered) nor reopens it
    # for longer; the next claim takes another probe at once.
    with Receiver() as receiver:
        refused = [db.enqueue(f"refused-{i}", receiver.url, max_attempts=1) for i in range(2)]
        destination = db.query("SELECT DISTINCT destination FROM outbox.messages")[0][0]
        db.query(
            "INSERT INTO outbox.destination_health (destination, state, blocked_until, opened_at)"
            " VALUES (%s, 'open', now() - interval '1 second', now()) RETURNING 1",
            destination,
        )
        stream = io.StringIO()
        config = fast_config(BREAKER, allow_private_networks=False)
        async with running(db, config, log=EventLog(stream=stream, format="json")):
            # each held unsent once refused (they used to go dead)
            held = (
                "SELECT count(*) FROM outbox.messages WHERE id = ANY(%s) AND state = 'ready'"
                " AND attempts = 0 AND starts_with(last_error, 'held unsent: ')"
            )
            await _poll(lambda: db.query(held, refused) == [(2,)])
        assert receiver.requests == []
    assert _health(db, destination) == ("open", 0)  # open, no failed probe counted
    events = [e for e in _events(stream) if e["event"].startswith("breaker_")]
    assert [e["event"] for e in events] == ["breaker_probing", "breaker_probe_returned"] * 2
    assert [e["message_id"] for e in events if e["event"] == "breaker_probing"] == refused
