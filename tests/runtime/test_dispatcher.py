"""The dispatcher in-process against real PostgreSQL and a real HTTP receiver."""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest

from dispatchers.cli import main
from dispatchers.delivery.retry import ExponentialBackoff
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog, NullLog
from dispatchers.runtime.waker import Waker
from dispatchers.store.messages import ClaimResult, Completion
from dispatchers.store.postgres import Store
from outbox.admin import status
from tests.database import Db
from tests.dispatching import drain, fast_config, running, wait_until
from tests.receiver import Received, Receiver, Reply


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


async def test_success_delivers_once_with_headers_and_moves_to_history(
    db: Db,
    receiver: Receiver,
) -> None:
    mid = db.enqueue(
        "order-1",
        receiver.url + "/orders",
        json={"total": 10},
        headers={"X-Tenant": "acme"},
    )
    dispatcher = await drain(db, fast_config())
    assert dispatcher.stats.delivered == 1
    (req,) = receiver.requests
    assert req.method == "POST"
    assert req.path == "/orders"
    assert req.body == b'{"total":10}'
    assert req.headers["idempotency-key"] == '"order-1"'
    assert req.headers["content-type"] == "application/json"
    assert req.headers["x-tenant"] == "acme"
    assert db.query("SELECT count(*) FROM outbox.messages") == [(0,)]
    assert db.query("SELECT id, attempts, last_status FROM outbox.delivered") == [(mid, 1, 200)]
    assert db.query("SELECT attempt, outcome, status, owner FROM outbox.attempts") == [
        (1, "delivered", 200, dispatcher.owner)
    ]


async def test_retry_then_success_sends_the_same_idempotency_key(
    db: Db, receiver: Receiver
) -> None:
    replies = iter([Reply(status=503), Reply(status=200)])
    receiver.responder = lambda req: next(replies)
    mid = db.enqueue("k-retry", receiver.url)
    dispatcher = Dispatcher(db.url, fast_config(), log=NullLog())
    task = asyncio.create_task(dispatcher.run())
    try:
        await asyncio.to_thread(receiver.wait_for, 2, 10.0)
        await wait_until(lambda: db.query("SELECT count(*) FROM outbox.delivered") == [(1,)])
    finally:
        dispatcher.stop()
        await task
    keys = [r.headers["idempotency-key"] for r in receiver.requests]
    assert keys == ['"k-retry"', '"k-retry"']
    assert db.query("SELECT attempt, outcome, status FROM outbox.attempts ORDER BY attempt") == [
        (1, "retry", 503),
        (2, "delivered", 200),
    ]
    assert db.query("SELECT attempts FROM outbox.delivered WHERE id = %s", mid) == [(2,)]


async def test_client_error_is_dead_after_one_attempt(db: Db, receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(status=422, body=b"bad field: total")
    mid = db.enqueue("k-422", receiver.url)
    await drain(db, fast_config())
    assert len(receiver.requests) == 1
    assert db.query(
        "SELECT state, attempts, last_status, lease_owner FROM outbox.messages WHERE id = %s", mid
    ) == [("dead", 1, 422, None)]
    assert db.query("SELECT outcome, error_class, response_excerpt FROM outbox.attempts") == [
        ("failed", "http_422", "bad field: total")
    ]


@pytest.mark.slow
async def test_retries_end_dead_when_attempts_are_spent(db: Db, receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(status=500)
    mid = db.enqueue("k-500", receiver.url, max_attempts=3)
    dispatcher = Dispatcher(db.url, fast_config(), log=NullLog())
    task = asyncio.create_task(dispatcher.run())
    try:
        await wait_until(
            lambda: db.query("SELECT state FROM outbox.messages WHERE id = %s", mid) == [("dead",)]
        )
    finally:
        dispatcher.stop()
        await task
    assert len(receiver.requests) == 3
    assert db.query(
        "SELECT attempts, last_status, last_error FROM outbox.messages WHERE id = %s", mid
    ) == [(3, 500, "HTTP 500 Internal Server Error")]
    assert [r[0] for r in db.query("SELECT outcome FROM outbox.attempts ORDER BY attempt")] == [
        "retry",
        "retry",
        "retry",
    ]


async def test_429_retry_after_is_honoured(db: Db, receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(status=429, headers={"Retry-After": "30"})
    mid = db.enqueue("k-429", receiver.url)
    before = datetime.now(UTC)
    await drain(db, fast_config())
    ((state, available_at, last_status),) = db.query(
        "SELECT state, available_at, last_status FROM outbox.messages WHERE id = %s", mid
    )
    assert (state, last_status) == ("ready", 429)
    # the policy alone would wait at most 0.1 s; the server asked for 30 s
    assert available_at - before >= timedelta(seconds=29)
    assert available_at - before <= timedelta(seconds=40)


@pytest.mark.slow
async def test_timeout_is_retried(db: Db, receiver: Receiver) -> None:
    # The answer comes long after request_timeout (1 s), so however late a loaded
    # machine fires the deadline, only the deadline can end the attempt.
    receiver.responder = lambda req: Reply(delay=10.0)
    mid = db.enqueue("k-slow", receiver.url)
    await drain(db, fast_config(retry_policy=ExponentialBackoff(base=60, cap=60, jitter=0)))
    assert db.query("SELECT state, attempts FROM outbox.messages WHERE id = %s", mid) == [
        ("ready", 1)
    ]
    ((outcome, error_class, duration_ms),) = db.query(
        "SELECT outcome, error_class, duration_ms FROM outbox.attempts"
    )
    assert (outcome, error_class) == ("retry", "timeout")
    # cut at request_timeout: never before it, and before the answer
    assert 1000 - 10 <= duration_ms < 10_000


async def test_connection_reset_is_retried(db: Db, receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(reset=True)
    mid = db.enqueue("k-reset", receiver.url)
    await drain(db, fast_config(retry_policy=ExponentialBackoff(base=60, cap=60, jitter=0)))
    assert db.query(
        "SELECT state, attempts, last_status FROM outbox.messages WHERE id = %s", mid
    ) == [("ready", 1, None)]
    ((outcome, error_class),) = db.query("SELECT outcome, error_class FROM outbox.attempts")
    assert outcome == "retry"
    assert error_class in ("network_error", "protocol_error")


async def test_ssrf_guard_refuses_loopback_by_default(
    db: Db, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    # Refused, the message is held unsent (it used to go dead at once): a setting
    # of the dispatcher, not a fault of the message.
    mid = db.enqueue("k-ssrf", receiver.url)
    dispatcher = await drain(db, fast_config(allow_private_networks=False))
    assert receiver.requests == []
    ((state, attempts, error, held_s),) = db.query(
        "SELECT state, attempts, last_error,"
        " EXTRACT(epoch FROM available_at - now()) FROM outbox.messages WHERE id = %s",
        mid,
    )
    assert (state, attempts) == ("ready", 0)  # never dead, no attempt spent
    assert "127.0.0.1" in error
    assert "--allow-private-networks" in error
    assert 30 < held_s <= 60  # held for blocked_delay, not claimed in every loop
    assert db.query("SELECT count(*) FROM outbox.attempts") == [(0,)]  # nothing was sent
    assert (dispatcher.stats.blocked, dispatcher.stats.dead) == (1, 0)
    # outbox status counts it, and says where to look
    with psycopg.connect(db.url) as conn:
        assert status(conn)["messages"]["held_unsent"] == 1
    assert main(["status", "--database-url", db.url]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"^held unsent \(see last error\) +1$", out, flags=re.M), out
    assert "1 message(s) held unsent" in err


@pytest.mark.slow
async def test_a_held_message_is_delivered_once_the_dispatcher_allows_its_destination(
    db: Db, receiver: Receiver
) -> None:
    stream = io.StringIO()
    mid = db.enqueue("k-held", receiver.url, max_attempts=1)
    held = fast_config(allow_private_networks=False, blocked_delay=1.0)
    for _ in range(3):  # held again and again: never spent, one attempt or not
        dispatcher = Dispatcher(db.url, held, log=EventLog(stream=stream, format="json"))
        async with asyncio.timeout(30):
            await dispatcher.run(drain=True)
        assert db.query("SELECT state, attempts FROM outbox.messages") == [("ready", 0)]
        db.query("UPDATE outbox.messages SET available_at = now() RETURNING id")
    assert receiver.requests == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    blocked = [e for e in events if e["event"] == "destination_blocked"]
    # once per destination per interval, naming the host and the option, no payload
    assert len(blocked) == 3, events  # one per dispatcher: each met it once
    assert blocked[0]["host"] == "127.0.0.1"
    assert "--allow-private-networks" in blocked[0]["hint"]
    assert "k-held" not in json.dumps(blocked)
    assert not [e for e in events if e["event"] == "dead"]

    # restarted with the option: delivered, once
    async with running(db, fast_config()) as dispatcher:
        await wait_until(lambda: dispatcher.stats.delivered == 1)
    assert len(receiver.requests) == 1
    assert db.query("SELECT id, attempts FROM outbox.delivered") == [(mid, 1)]


async def test_refused_messages_are_one_event_per_destination_not_one_per_message(
    db: Db, receiver: Receiver
) -> None:
    stream = io.StringIO()
    for i in range(20):
        db.enqueue(f"k-many-{i}", receiver.url)
    dispatcher = Dispatcher(
        db.url,
        fast_config(allow_private_networks=False),
        log=EventLog(stream=stream, format="json"),
    )
    async with asyncio.timeout(30):
        await dispatcher.run(drain=True)
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    blocked = [e for e in events if e["event"] == "destination_blocked"]
    assert len(blocked) == 1, blocked
    assert blocked[0]["held"] == 1  # the first one, at once; the others counted in the next
    assert dispatcher.stats.blocked == 20
    assert db.query("SELECT state, attempts, count(*) FROM outbox.messages GROUP BY 1, 2") == [
        ("ready", 0, 20)
    ]
    assert receiver.requests == []


async def test_response_excerpt_is_bounded(db: Db, receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(status=400, body=b"x" * 200_000)
    db.enqueue("k-big", receiver.url)
    await drain(db, fast_config())
    ((excerpt,),) = db.query("SELECT response_excerpt FROM outbox.attempts")
    assert excerpt == "x" * 1024


@pytest.mark.slow
async def test_notify_wakes_an_idle_dispatcher_before_the_poll_interval(
    db: Db,
    receiver: Receiver,
) -> None:
    # It polls once a minute, and the message must arrive within 20 s: polling
    # cannot deliver it, only the producer's notification can.
    dispatcher = Dispatcher(db.url, fast_config(poll_interval=60.0), log=NullLog())
    waker = dispatcher.waker
    assert waker is not None
    task = asyncio.create_task(dispatcher.run())
    try:
        await wait_until_idle(dispatcher, waker)
        claims, notifications = dispatcher.stats.claims, waker.notifications
        db.enqueue("k-wake", receiver.url)
        await asyncio.to_thread(receiver.wait_for, 1, 20.0)
        assert waker.notifications > notifications
        assert dispatcher.stats.claims == claims + 1  # the one the notification prompted
    finally:
        dispatcher.stop()
        await task


async def wait_until_idle(dispatcher: Dispatcher, waker: Waker) -> None:
    """Return once ``dispatcher`` waits for a notification: on duty, holding the wake
    lock (so every producer notifies it), and done with the claims that getting
    there prompted (each change of the waker's state wakes the claim loop once; a
    claim a few milliseconds later is one of those, so quiet means a second with
    no claim)."""
    seen = (-1, False)
    quiet_since = time.monotonic()
    deadline = quiet_since + 20.0
    while time.monotonic() < deadline:
        now = (dispatcher.stats.claims, waker.notified)
        if now != seen:
            seen, quiet_since = now, time.monotonic()
        elif waker.notified and time.monotonic() - quiet_since >= 1.0:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"not idle in time: {seen} (claims, holding the wake lock)")


@pytest.mark.slow
async def test_ordering_key_delivers_one_at_a_time_in_id_order(db: Db, receiver: Receiver) -> None:
    active = 0
    overlap = False
    lock = threading.Lock()

    def respond(req: Received) -> Reply:
        nonlocal active, overlap
        with lock:
            active += 1
            overlap = overlap or active > 1
        time.sleep(0.05)
        with lock:
            active -= 1
        return Reply()

    receiver.responder = respond
    ids = [db.enqueue(f"acct-{i}", receiver.url, ordering_key="acct") for i in range(5)]
    await drain(db, fast_config(concurrency=16))
    assert [r.body for r in receiver.requests] == [
        f'{{"key":"acct-{i}"}}'.encode() for i in range(5)
    ]
    assert not overlap
    assert sorted(r[0] for r in db.query("SELECT id FROM outbox.delivered")) == ids


async def test_dead_message_does_not_block_its_ordering_key(db: Db, receiver: Receiver) -> None:
    receiver.responder = lambda req: Reply(status=400 if b"first" in req.body else 200)
    first = db.enqueue("o-1", receiver.url, json="first", ordering_key="k")
    second = db.enqueue("o-2", receiver.url, json="second", ordering_key="k")
    await drain(db, fast_config())
    assert db.query("SELECT id, state FROM outbox.messages") == [(first, "dead")]
    assert db.query("SELECT id FROM outbox.delivered") == [(second,)]


@pytest.mark.slow
async def test_requests_in_flight_never_exceed_the_concurrency(db: Db, receiver: Receiver) -> None:
    # Outcomes waiting for their write no longer hold a request slot, so claiming
    # overlaps the writes; the number of requests open at once must still stay
    # within --concurrency, and reach it. The transport allows many connections,
    # so the bound measured is the dispatcher's own.
    lock = threading.Lock()
    active = peak = 0

    def respond(req: Received) -> Reply:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.02)
        with lock:
            active -= 1
        return Reply()

    receiver.responder = respond
    for i in range(60):
        db.enqueue(f"cap-{i}", receiver.url)
    transport = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=100))
    try:
        dispatcher = await drain(db, fast_config(concurrency=4, batch_size=4), transport=transport)
    finally:
        await transport.aclose()
    assert dispatcher.stats.delivered == 60
    assert len(receiver.requests) == 60
    assert peak == 4


async def test_claim_respects_ordering_and_batch_limit(db: Db) -> None:
    url = "https://example.com/x"
    a1 = db.enqueue("a1", url, ordering_key="a")
    db.enqueue("a2", url, ordering_key="a")
    b1 = db.enqueue("b1", url)
    db.enqueue("b2", url)
    store = Store(db.url, fast_config())
    await store.open()
    try:
        jobs = (await store.claim("owner-x", 3)).messages
        assert [j.id for j in jobs] == [a1, b1, b1 + 1]
        assert [j.attempts for j in jobs] == [1, 1, 1]
        assert (await store.claim("owner-x", 10)).messages == []  # a2 waits for a1
    finally:
        await store.close()


async def test_stale_outcome_of_another_owner_changes_nothing(db: Db) -> None:
    mid = db.enqueue("fence-1", "https://example.com/x")
    store = Store(db.url, fast_config())
    await store.open()
    try:
        (job,) = (await store.claim("owner-a", 1)).messages
        db.expire(mid)
        assert await store.rescue() == [(mid, "ready")]
        (job_b,) = (await store.claim("owner-b", 1)).messages
        assert job_b.attempts == 2
        stale = Completion(
            id=mid,
            attempt=job.attempts,
            state="delivered",
            outcome="delivered",
            sent=True,
            status=200,
            started_at=datetime.now(UTC),
            duration_ms=5,
        )
        assert await store.complete("owner-a", [stale]) == (set(), {})
        assert db.query(
            "SELECT state, lease_owner, attempts FROM outbox.messages WHERE id = %s", mid
        ) == [("running", "owner-b", 2)]
        assert db.query("SELECT attempt, owner, outcome FROM outbox.attempts") == [
            (1, "owner-a", "lease_expired")
        ]
        assert await store.renew("owner-a", [(mid, 1)]) == set()
        assert await store.renew("owner-b", [(mid, 2)]) == {mid}
    finally:
        await store.close()


async def test_stale_outcome_of_the_same_owner_is_fenced_by_attempt(db: Db) -> None:
    mid = db.enqueue("fence-2", "https://example.com/x")
    store = Store(db.url, fast_config())
    await store.open()
    try:
        (first,) = (await store.claim("owner-a", 1)).messages
        db.expire(mid)
        await store.rescue()
        (second,) = (await store.claim("owner-a", 1)).messages
        assert (first.attempts, second.attempts) == (1, 2)
        now = datetime.now(UTC)
        stale = Completion(
            id=mid,
            attempt=1,
            state="dead",
            outcome="failed",
            sent=True,
            status=400,
            started_at=now,
            duration_ms=1,
        )
        assert await store.complete("owner-a", [stale]) == (set(), {})
        assert db.query("SELECT state, attempts FROM outbox.messages WHERE id = %s", mid) == [
            ("running", 2)
        ]
        fresh = Completion(
            id=mid,
            attempt=2,
            state="delivered",
            outcome="delivered",
            sent=True,
            status=200,
            started_at=now,
            duration_ms=1,
        )
        assert await store.complete("owner-a", [fresh]) == ({mid}, {})
        assert db.query("SELECT attempts, last_status FROM outbox.delivered") == [(2, 200)]
        assert db.query("SELECT attempt, outcome FROM outbox.attempts ORDER BY attempt") == [
            (1, "lease_expired"),
            (2, "delivered"),
        ]
        # Asked after a retried write: the success is recorded; the stale outcome is
        # not, though the rescuer wrote an attempt row under this owner for it.
        assert await store.recorded("owner-a", [fresh]) == {mid}
        assert await store.recorded("owner-a", [stale]) == set()
        assert await store.recorded("owner-b", [fresh]) == set()
    finally:
        await store.close()


async def test_frozen_delivery_past_its_lease_cannot_complete(db: Db, receiver: Receiver) -> None:
    release = threading.Event()
    receiver.responder = lambda req: (release.wait(10), Reply())[1]
    mid = db.enqueue("frozen", receiver.url)
    # A long lease: no heartbeat fires during the test; the test expires the lease.
    # One request slot, taken by the frozen delivery: the dispatcher claims nothing
    # more, so the rescued message is owner-b's to claim.
    dispatcher = Dispatcher(
        db.url, fast_config(lease=60.0, rescue_interval=60.0, concurrency=1), log=NullLog()
    )
    task = asyncio.create_task(dispatcher.run())
    store = Store(db.url, fast_config())
    await store.open()
    try:
        await asyncio.to_thread(receiver.wait_for, 1, 10.0)
        db.expire(mid)
        assert await store.rescue() == [(mid, "ready")]
        (job_b,) = (await store.claim("owner-b", 1)).messages
        release.set()  # the frozen delivery now finishes with 200
        await wait_until(lambda: dispatcher.stats.lease_lost == 1)
        assert dispatcher.stats.delivered == 0
        assert db.query(
            "SELECT state, lease_owner, attempts FROM outbox.messages WHERE id = %s", mid
        ) == [("running", "owner-b", 2)]
        assert db.query("SELECT count(*) FROM outbox.delivered") == [(0,)]
        assert db.query("SELECT attempt, owner, outcome FROM outbox.attempts") == [
            (1, dispatcher.owner, "lease_expired")
        ]
        assert job_b.attempts == 2
    finally:
        release.set()
        dispatcher.stop()
        await task
        await store.close()


@pytest.mark.slow
async def test_heartbeat_cancels_a_delivery_whose_lease_was_lost(
    db: Db, receiver: Receiver
) -> None:
    release = threading.Event()
    receiver.responder = lambda req: (release.wait(10), Reply())[1]
    mid = db.enqueue("lost", receiver.url)
    dispatcher = Dispatcher(
        db.url, fast_config(lease=6.0, request_timeout=3.0, rescue_interval=60.0), log=NullLog()
    )
    task = asyncio.create_task(dispatcher.run())
    try:
        await asyncio.to_thread(receiver.wait_for, 1, 10.0)
        # Another party takes the message over while the request hangs.
        db.query(
            "UPDATE outbox.messages SET lease_owner = 'thief', attempts = attempts + 1 "
            "WHERE id = %s RETURNING id",
            mid,
        )
        await wait_until(lambda: dispatcher.stats.lease_lost == 1, seconds=5.0)
        assert dispatcher.in_flight == 0
    finally:
        release.set()
        dispatcher.stop()
        await task
    assert dispatcher.stats.delivered == 0
    assert dispatcher.stats.retried == 0
    assert db.query("SELECT lease_owner, attempts FROM outbox.messages") == [("thief", 2)]
    assert db.query("SELECT count(*) FROM outbox.attempts") == [(0,)]


async def test_claim_uses_the_partial_index(db: Db) -> None:
    with psycopg.connect(db.url) as conn:
        conn.execute(
            "INSERT INTO outbox.messages (idempotency_key, target, destination, url, body,"
            " content_type, state, max_attempts, completed_at)"
            " SELECT 'k' || g, 'https://example.com', 'https://example.com:443',"
            " 'https://example.com', '', 'text/plain',"
            " CASE WHEN g % 100 = 0 THEN 'ready' ELSE 'dead' END, 5,"
            " CASE WHEN g % 100 = 0 THEN NULL ELSE now() END"
            " FROM generate_series(1, 20000) AS g"
        )
        conn.execute("ANALYZE outbox.messages")
        claim, params = Store(db.url, fast_config()).claim_statement("o", 10, capped=True)
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + claim.text, params))
    assert "messages_claimable_idx" in plan, plan
    assert "Seq Scan on messages" not in plan, plan


@pytest.mark.slow
async def test_an_outcome_the_database_refuses_does_not_block_the_others(
    db: Db, receiver: Receiver
) -> None:
    bad = db.enqueue("refused", receiver.url)
    good = db.enqueue("fine", receiver.url)
    # A stray attempt row makes the first outcome of `bad` violate the primary key.
    db.query(
        "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)"
        " VALUES (%s, 1, 'someone', now(), 'stray') RETURNING message_id",
        bad,
    )
    dispatcher = Dispatcher(db.url, fast_config(), log=NullLog())
    task = asyncio.create_task(dispatcher.run())
    try:
        await wait_until(lambda: db.query("SELECT count(*) FROM outbox.delivered") == [(2,)])
    finally:
        dispatcher.stop()
        await task
    # `good` went through at once; `bad` was dropped, rescued after its lease and sent again
    assert db.query("SELECT id, attempts FROM outbox.delivered ORDER BY id") == [
        (bad, 2),
        (good, 1),
    ]
    assert dispatcher.stats.rescued == 1
    assert [r.headers["idempotency-key"] for r in receiver.requests].count('"refused"') == 2


async def test_a_claim_that_commits_after_the_stop_signal_is_released_unsent(
    db: Db, receiver: Receiver
) -> None:
    ids = [db.enqueue(f"late-{i}", receiver.url) for i in range(3)]
    dispatchers: list[Dispatcher] = []

    class StopDuringClaim(Store):
        """The real store; the stop signal arrives while the claim commits."""

        async def claim(
            self,
            owner: str,
            limit: int,
            busy: Mapping[str, int] | None = None,
            alone: str | None = None,
        ) -> ClaimResult:
            claimed = await super().claim(owner, limit, busy, alone)
            dispatchers[0].stop()
            return claimed

    config = fast_config()
    dispatcher = Dispatcher(db.url, config, log=NullLog(), store=StopDuringClaim(db.url, config))
    dispatchers.append(dispatcher)
    async with asyncio.timeout(20):
        stats = await dispatcher.run()
    assert stats.claimed == 0
    assert stats.released == 3
    assert receiver.requests == []
    # back to ready at once, the attempt refunded (nothing was sent), no attempt rows
    assert db.query(
        "SELECT id, state, attempts, lease_owner, available_at <= now() FROM outbox.messages"
        " ORDER BY id"
    ) == [(i, "ready", 0, None, True) for i in ids]
    assert db.query("SELECT count(*) FROM outbox.attempts") == [(0,)]
