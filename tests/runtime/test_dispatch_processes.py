"""Real ``outbox dispatch`` processes against the test PostgreSQL and a receiver on
127.0.0.1: draining with several processes, rescue after SIGKILL, graceful
shutdown, a database restart, and what the JSON logs may contain.

Every wait is bounded (process waits and database polls have deadlines) and every
process is killed when its test ends. Traffic goes only to 127.0.0.1.

Lease budget: the configuration validator wants
``lease >= 1.5 * (request_timeout + flush_interval + statement_timeout)`` and
``claim_timeout, statement_timeout <= lease / 3``. With the defaults (statement 3 s,
claim 2 s) that means ``lease >= 9``, whatever the request timeout; the CLI does
not expose either timeout, so these tests use a 9-10 s lease.
"""

from __future__ import annotations

import collections
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from dispatchers.cli._exit import ExitCode
from tests.conftest import PgServer
from tests.processes import (
    Fleet,
    enqueue_many,
    query,
    scalar,
    structured_key,
    terminate,
    wait_until,
)
from tests.receiver import Received, Receiver, Reply

FAST = ("--request-timeout", "1", "--connect-timeout", "0.5", "--lease", "9")
# Where no fault is injected, a slow moment on a loaded machine must not look
# like one: generous request timeouts, so every message is sent exactly once.
RELAXED = ("--request-timeout", "10", "--connect-timeout", "5", "--lease", "30")
"""The shortest lease the validator accepts with the default statement timeouts."""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as fleet:
        yield fleet


def keys_seen(requests: list[Received]) -> collections.Counter[str]:
    return collections.Counter(r.headers.get("idempotency-key", "") for r in requests)


def snapshot(receiver: Receiver) -> list[Received]:
    with receiver.lock:
        return list(receiver.requests)


def states(url: str) -> dict[str, int]:
    return dict(query(url, "SELECT state, count(*) FROM outbox.messages GROUP BY state"))


# -- 1. several processes drain one backlog -------------------------------------


@pytest.mark.parametrize("processes", [2, 4])
@pytest.mark.slow
def test_processes_drain_backlog_each_key_once(
    database_url: str, fleet: Fleet, processes: int
) -> None:
    total = 5000
    keys = [f"drain-{i:05d}" for i in range(total)]
    with Receiver() as receiver:
        ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
        assert len(set(ids)) == total

        procs = [
            fleet.start(database_url, *RELAXED, "--concurrency", "32", "--drain")
            for _ in range(processes)
        ]
        for proc in procs:
            rc = proc.wait(timeout=50)
            assert rc == 0, proc.describe()
        requests = snapshot(receiver)

    # the database: nothing left, everything in history, one attempt each
    assert scalar(database_url, "SELECT count(*) FROM outbox.messages") == 0
    delivered = query(
        database_url, "SELECT id, idempotency_key, attempts, last_status FROM outbox.delivered"
    )
    assert sorted(row[0] for row in delivered) == sorted(ids)
    assert sorted(row[1] for row in delivered) == keys
    assert {(row[2], row[3]) for row in delivered} == {(1, 200)}
    attempts = query(
        database_url, "SELECT message_id, attempt, outcome, status, owner FROM outbox.attempts"
    )
    assert len(attempts) == total
    assert sorted(row[0] for row in attempts) == sorted(ids)
    assert {(row[1], row[2], row[3]) for row in attempts} == {(1, "delivered", 200)}
    # every owner is one of our processes
    owners = {row[4] for row in attempts}
    assert all(any(p.owns(owner) for p in procs) for owner in owners), owners

    # the receiver: each key exactly once
    seen = keys_seen(requests)
    assert len(requests) == total
    assert seen == collections.Counter(structured_key(k) for k in keys)

    # the logs agree: one "delivered" event per message, across all processes
    delivered_events = [e for p in procs for e in p.events() if e["event"] == "delivered"]
    assert sorted(e["message_id"] for e in delivered_events) == sorted(ids)


# -- 2. a killed dispatcher's messages are rescued after the lease ---------------


@pytest.mark.slow
def test_sigkilled_dispatcher_messages_rescued_after_lease(database_url: str, fleet: Fleet) -> None:
    release = threading.Event()

    def hold_until_released(req: Received) -> Reply:
        release.wait(30)  # bounded, and set by the test long before
        return Reply()

    held_count, total = 10, 30
    keys = [f"rescue-{i:02d}" for i in range(total)]
    with Receiver(hold_until_released) as receiver:
        try:
            ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
            first = fleet.start(
                database_url,
                *FAST,
                *("--concurrency", str(held_count), "--destination-concurrency", str(held_count)),
            )
            receiver.wait_for(held_count, timeout=30)
            first.signal(signal.SIGKILL)
            assert first.wait(timeout=10) == -signal.SIGKILL
        finally:
            release.set()  # later requests are answered at once

        running = query(
            database_url,
            "SELECT id, lease_owner, lease_until, attempts, lease_until > now()"
            " FROM outbox.messages WHERE state = 'running' ORDER BY id",
        )
        assert len(running) == held_count
        assert all(first.owns(row[1]) and row[3] == 1 and row[4] for row in running), running
        killed_owner = running[0][1]
        lease_until: dict[int, datetime] = {row[0]: row[2] for row in running}
        held_keys = {key for key, mid in zip(keys, ids, strict=True) if mid in lease_until}
        assert keys_seen(snapshot(receiver)) == collections.Counter(
            structured_key(k) for k in held_keys
        )

        # A second dispatcher delivers the rest at once, but leaves the dead owner's
        # rows alone until their lease expires; then its rescuer hands them on.
        second = fleet.start(database_url, *FAST, "--concurrency", "10", "--drain")
        wait_until(
            lambda: (
                scalar(database_url, "SELECT count(*) FROM outbox.delivered") >= total - held_count
            ),
            timeout=30,
            what="the unclaimed messages to be delivered",
            processes=[second],
        )
        still = query(
            database_url,
            "SELECT id, lease_owner FROM outbox.messages WHERE state = 'running'"
            " AND lease_until > now()",
        )
        # (only meaningful while the lease is live; a slow machine may be past it)
        assert all(row[1] == killed_owner for row in still), still

        rc = second.wait(timeout=45)
        assert rc == 0, second.describe()
        requests = snapshot(receiver)

    assert scalar(database_url, "SELECT count(*) FROM outbox.messages") == 0
    delivered = dict(query(database_url, "SELECT id, attempts FROM outbox.delivered"))
    assert sorted(delivered) == sorted(ids)
    for mid in ids:
        assert delivered[mid] == (2 if mid in lease_until else 1), mid

    attempts = query(
        database_url,
        "SELECT message_id, attempt, owner, outcome, started_at FROM outbox.attempts"
        " ORDER BY message_id, attempt",
    )
    by_message: dict[int, list[tuple[int, str, str, datetime]]] = collections.defaultdict(list)
    for mid, attempt, owner, outcome, started_at in attempts:
        by_message[mid].append((attempt, owner, outcome, started_at))
    for mid in ids:
        rows = by_message[mid]
        if mid in lease_until:
            (a1, owner1, outcome1, rescued_at), (a2, owner2, outcome2, _) = rows
            assert (a1, owner1, outcome1) == (1, killed_owner, "lease_expired")
            # rescued no earlier than the lease the dead owner held
            assert rescued_at >= lease_until[mid]
            assert (a2, outcome2) == (2, "delivered") and second.owns(owner2)
        else:
            [(a1, owner1, outcome1, _)] = rows
            assert (a1, outcome1) == (1, "delivered") and second.owns(owner1)

    # The receiver saw the held keys twice (the killed attempt reached it), the
    # rest once: one effect per key at a deduping receiver.
    expected = collections.Counter(structured_key(k) for k in keys)
    expected.update(structured_key(k) for k in held_keys)
    assert keys_seen(requests) == expected
    rescued_events = [e for e in second.events() if e["event"] == "rescued"]
    assert sorted(e["message_id"] for e in rescued_events) == sorted(lease_until)
    assert {e["state"] for e in rescued_events} == {"ready"}


# -- 3. graceful shutdown --------------------------------------------------------

SHUTDOWN = ("--lease", "10", "--request-timeout", "3", "--connect-timeout", "0.5")
"""A request timeout long enough that a request is still in flight at the signal."""


@pytest.mark.slow
def test_sigterm_releases_inflight_after_grace(database_url: str, fleet: Fleet) -> None:
    inflight, total = 5, 20
    keys = [f"grace-short-{i:02d}" for i in range(total)]
    with Receiver(lambda req: Reply(delay=5.0)) as receiver:
        ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
        proc = fleet.start(
            database_url,
            *SHUTDOWN,
            *("--concurrency", str(inflight), "--destination-concurrency", str(inflight)),
            *("--grace", "0.5"),
        )
        receiver.wait_for(inflight, timeout=30)
        signalled = terminate(proc)
        rc = proc.wait(timeout=15)
        stopped = time.monotonic()
        assert rc == 0, proc.describe()
        # it stops, with slack for a loaded machine; the "released" outcomes below
        # prove that the grace, not the requests' timeout, ended the deliveries
        assert stopped - signalled < 10
        requests = snapshot(receiver)

    # no request reached the receiver after the signal
    assert len(requests) == inflight
    assert all(r.at <= signalled for r in requests)
    sent_keys = {r.headers["idempotency-key"] for r in requests}

    rows = query(
        database_url,
        "SELECT id, idempotency_key, state, lease_owner, lease_until, attempts,"
        " available_at <= now() FROM outbox.messages ORDER BY id",
    )
    assert [row[0] for row in rows] == ids  # nothing delivered, nothing lost
    for mid, key, state, owner, until, attempts, due in rows:
        assert (state, owner, until, due) == ("ready", None, None, True), mid
        assert attempts == (1 if structured_key(key) in sent_keys else 0), mid

    released = query(
        database_url,
        "SELECT m.idempotency_key, a.attempt, a.outcome, a.error_class, a.owner"
        " FROM outbox.attempts AS a JOIN outbox.messages AS m ON m.id = a.message_id",
    )
    assert {structured_key(row[0]) for row in released} == sent_keys
    assert len(released) == inflight
    for _, attempt, outcome, error_class, owner in released:
        assert (attempt, outcome, error_class) == (1, "released", "shutdown")
        assert proc.owns(owner)
    events = proc.events()
    assert len([e for e in events if e["event"] == "released"]) == inflight
    assert not [e for e in events if e["event"] in ("delivered", "retried", "dead")]


@pytest.mark.slow
def test_a_second_signal_ends_the_grace_period_at_once(database_url: str, fleet: Fleet) -> None:
    inflight = 3
    keys = [f"grace-cut-{i:02d}" for i in range(inflight)]
    with Receiver(lambda req: Reply(delay=30.0)) as receiver:
        enqueue_many(database_url, f"{receiver.url}/hook", keys)
        proc = fleet.start(
            database_url,
            # the requests outlast the test: only the second signal can end them
            *("--lease", "90", "--request-timeout", "40", "--connect-timeout", "0.5"),
            *("--concurrency", str(inflight), "--destination-concurrency", str(inflight)),
            *("--grace", "60"),
        )
        receiver.wait_for(inflight, timeout=30)
        terminate(proc)
        # the first signal says what it waits for, and how to stop now
        wait_until(
            lambda: [e for e in proc.events() if e["event"] == "stopping"],
            timeout=15,
            what="the stopping event",
            processes=[proc],
        )
        (stopping,) = [e for e in proc.events() if e["event"] == "stopping"]
        assert (stopping["in_flight"], stopping["grace_s"]) == (inflight, 60)
        assert "signal again" in stopping["hint"]
        second = terminate(proc)
        assert proc.wait(timeout=20) == 0, proc.describe()
        assert time.monotonic() - second < 15  # not the 60 s grace, nor the 30 s answers
    released = query(database_url, "SELECT outcome, error_class FROM outbox.attempts")
    assert released == [("released", "shutdown")] * inflight
    rows = query(database_url, "SELECT state, lease_owner FROM outbox.messages")
    assert rows == [("ready", None)] * inflight


@pytest.mark.slow
def test_sigterm_lets_inflight_finish_within_grace(database_url: str, fleet: Fleet) -> None:
    inflight, total = 5, 20
    keys = [f"grace-long-{i:02d}" for i in range(total)]
    with Receiver(lambda req: Reply(delay=1.0)) as receiver:
        ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
        proc = fleet.start(
            database_url,
            *SHUTDOWN,
            *("--concurrency", str(inflight), "--destination-concurrency", str(inflight)),
            *("--grace", "10"),
        )
        receiver.wait_for(inflight, timeout=30)
        signalled = terminate(proc)
        rc = proc.wait(timeout=15)
        assert rc == 0, proc.describe()
        requests = snapshot(receiver)

    assert len(requests) == inflight
    assert all(r.at <= signalled for r in requests)
    sent_keys = {r.headers["idempotency-key"] for r in requests}

    delivered = query(
        database_url, "SELECT idempotency_key, attempts, last_status FROM outbox.delivered"
    )
    assert {structured_key(row[0]) for row in delivered} == sent_keys
    assert {(row[1], row[2]) for row in delivered} == {(1, 200)}
    remaining = query(
        database_url,
        "SELECT id, state, attempts, lease_owner FROM outbox.messages ORDER BY id",
    )
    assert len(remaining) == total - inflight
    assert {row[0] for row in remaining} < set(ids)
    assert {(row[1], row[2], row[3]) for row in remaining} == {("ready", 0, None)}
    attempts = query(database_url, "SELECT attempt, outcome FROM outbox.attempts")
    assert sorted(attempts) == [(1, "delivered")] * inflight
    events = proc.events()
    assert len([e for e in events if e["event"] == "delivered"]) == inflight
    assert not [e for e in events if e["event"] == "released"]


# -- 4. PostgreSQL restarts under the dispatchers --------------------------------


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_database_restart_mid_run_loses_nothing(
    pg_server: PgServer, database_url: str, fleet: Fleet
) -> None:
    if not pg_server.restartable:
        pytest.skip("needs a server the tests started (OUTBOX_TEST_DATABASE_URL is set)")
    url_before = pg_server.current_url()
    total = 2000
    keys = [f"restart-{i:04d}" for i in range(total)]
    # A small reply delay keeps the run going long enough to restart in the middle.
    with Receiver(lambda req: Reply(delay=0.05)) as receiver:
        ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
        procs = [
            fleet.start(database_url, *FAST, "--concurrency", "8", "--drain") for _ in range(2)
        ]
        wait_until(
            lambda: scalar(database_url, "SELECT count(*) FROM outbox.delivered") >= 200,
            timeout=30,
            what="the first deliveries",
            processes=procs,
        )
        try:
            pg_server.stop()
            down_at = time.monotonic()
            time.sleep(2.0)
            assert all(p.running() for p in procs), [p.describe() for p in procs]
        finally:
            pg_server.start()
        assert pg_server.current_url() == url_before
        up_after = time.monotonic() - down_at

        for proc in procs:
            rc = proc.wait(timeout=50)
            assert rc == 0, proc.describe()
        requests = snapshot(receiver)

    assert up_after >= 2.0
    assert states(database_url) == {}
    delivered = dict(query(database_url, "SELECT id, attempts FROM outbox.delivered"))
    assert sorted(delivered) == sorted(ids)

    # Each attempt number of each message has exactly one attempt row, and the
    # last one succeeded.
    attempts = query(
        database_url,
        "SELECT message_id, array_agg(CAST(attempt AS integer) ORDER BY attempt),"
        " (array_agg(outcome ORDER BY attempt DESC))[1]"
        " FROM outbox.attempts GROUP BY message_id",
    )
    assert len(attempts) == total
    for mid, numbers, last_outcome in attempts:
        assert numbers == list(range(1, delivered[mid] + 1)), (mid, numbers)
        assert last_outcome == "delivered", mid

    # Every key reached the receiver; a key seen more than once belongs to a
    # message that needed more than one attempt.
    by_key = dict(query(database_url, "SELECT idempotency_key, attempts FROM outbox.delivered"))
    seen = keys_seen(requests)
    assert set(seen) == {structured_key(k) for k in keys}
    for key, count in by_key.items():
        assert 1 <= seen[structured_key(key)] <= count, key
    db_errors = [e for p in procs for e in p.events() if e["event"] == "db_error"]
    assert db_errors, "the restart went unnoticed: was the server really stopped?"


# -- 5. logs: JSON lines, never payloads or secrets ------------------------------


@pytest.mark.slow
def test_json_logs_never_contain_payload_or_secrets(database_url: str, fleet: Fleet) -> None:
    secret_header = "s3cr3t-value"
    secret_query = "s3cr3t-query-token"
    marker = "PAYLOAD-MARKER"

    def reply(req: Received) -> Reply:
        # Echo the body, so that response excerpts carry the payload too.
        status = {"/ok": 200, "/bad": 400, "/busy": 503}[req.path.split("?")[0]]
        return Reply(status=status, body=req.body, headers={"X-Echo": secret_header})

    with Receiver(reply) as receiver:
        ids: list[int] = []
        for path in ("/ok", "/bad", "/busy"):
            ids += enqueue_many(
                database_url,
                f"{receiver.url}{path}?token={secret_query}",
                [f"log{path}-{i}" for i in range(3)],
                headers={"X-Secret": secret_header},
                body=f'{{"note": "{marker}"}}',
            )
        proc = fleet.start(database_url, *FAST, "--drain", "--log-level", "debug")
        rc = proc.wait(timeout=30)
        assert rc == ExitCode.DEAD_AFTER_DRAIN, proc.describe()  # the /bad ones went dead
        requests = snapshot(receiver)

    # the secrets were really in play
    assert len(requests) == len(ids)
    assert all(r.headers["x-secret"] == secret_header for r in requests)
    assert all(marker.encode() in r.body for r in requests)
    assert states(database_url) == {"ready": 3, "dead": 3}

    stdout = proc.stdout()
    lines = stdout.splitlines()
    assert lines
    events = proc.events()  # every line parses as a JSON object
    assert len(events) == len(lines)
    for event in events:
        assert isinstance(event.get("event"), str) and event["event"], event
        assert isinstance(event.get("ts"), str), event
        datetime.fromisoformat(event["ts"])
    names = collections.Counter(e["event"] for e in events)
    assert names["claimed"] == len(ids)
    assert names["delivered"] == 3 and names["dead"] == 3 and names["retried"] == 3
    assert names["drained"] == 1
    for output in (stdout, proc.stderr()):
        for secret in (marker, secret_header, secret_query):
            assert secret not in output
