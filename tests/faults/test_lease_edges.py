"""Lease edges: a dispatcher frozen past its lease, attempts spent while a
dispatcher dies mid-delivery, and a flush that meets a lock held past its timeout.

The invariants: a fenced-out owner changes nothing, no outcome is lost, and each
outcome is recorded once. Dispatcher processes are real ``outbox dispatch``
subprocesses (killed when the test ends); every wait is bounded.

Lease budget: the CLI keeps the default statement timeout (3 s), so its lease is
at least 9 s (see tests/runtime/test_dispatch_processes.py); a request timeout
of 2.5 s fits in it and leaves time to freeze the dispatcher mid-request.
"""

from __future__ import annotations

import asyncio
import io
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog
from dispatchers.store.postgres import Completion, Store
from outbox import Outbox
from tests.database import Db
from tests.dispatching import fast_config
from tests.processes import DispatcherProcess, Fleet, query, scalar, terminate, wait_until
from tests.receiver import Received, Receiver, Reply

PROCESS_ARGS = ("--request-timeout", "2.5", "--connect-timeout", "0.5", "--lease", "9")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as fleet:
        yield fleet


class HoldFirst:
    """A responder that holds the first request until released (at most 40 s) and
    answers every later one at once with 200."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._seen = 0

    def __call__(self, req: Received) -> Reply:
        with self._lock:
            self._seen += 1
            first = self._seen == 1
        if first:
            self.release.wait(40)
        return Reply()


def enqueue(url: str, target: str, key: str, **kwargs: Any) -> int:
    with psycopg.connect(url) as conn:
        return Outbox().enqueue(conn, url=target, idempotency_key=key, json={"k": key}, **kwargs)


def lease_expired(url: str, mid: int) -> Callable[[], bool]:
    return lambda: bool(
        scalar(url, "SELECT lease_until < now() FROM outbox.messages WHERE id = %s", (mid,))
    )


def events_for(process: DispatcherProcess, mid: int) -> list[str]:
    return [e["event"] for e in process.events() if e.get("message_id") == mid]


def test_a_frozen_dispatcher_resumed_after_its_lease_changes_nothing(
    database_url: str, fleet: Fleet
) -> None:
    hold = HoldFirst()
    with Receiver(hold) as receiver:
        try:
            mid = enqueue(database_url, f"{receiver.url}/hook", "frozen-1")
            first = fleet.start(database_url, *PROCESS_ARGS)
            receiver.wait_for(1, timeout=20)
            first.signal(signal.SIGSTOP)  # mid-request, before its 2.5 s timeout
            owner_a = scalar(
                database_url, "SELECT lease_owner FROM outbox.messages WHERE id = %s", (mid,)
            )
            assert first.owns(owner_a)
            # No heartbeat while frozen: the lease (9 s) runs out.
            wait_until(lease_expired(database_url, mid), timeout=15, what="the lease to expire")
            second = fleet.start(database_url, *PROCESS_ARGS, "--drain")
            assert second.wait(timeout=30) == 0, second.describe()
            hold.release.set()  # the first request gets its 200 now, too late
        finally:
            hold.release.set()
            first.signal(signal.SIGCONT)
        wait_until(
            lambda: "lease_lost" in events_for(first, mid),
            timeout=15,
            what="lease_lost from the resumed dispatcher",
            processes=[first],
        )
        terminate(first)
        assert first.wait(timeout=20) == 0, first.describe()
        requests = list(receiver.requests)

    # Delivered once, by the second dispatcher; the stale outcome wrote nothing.
    assert scalar(database_url, "SELECT count(*) FROM outbox.messages") == 0
    assert query(database_url, "SELECT id, attempts, last_status FROM outbox.delivered") == [
        (mid, 2, 200)
    ]
    rows = query(
        database_url, "SELECT attempt, owner, outcome FROM outbox.attempts ORDER BY attempt"
    )
    assert [(r[0], r[2]) for r in rows] == [(1, "lease_expired"), (2, "delivered")]
    assert rows[0][1] == owner_a
    assert second.owns(rows[1][1])
    # The receiver saw the same key twice (at least once; it dedupes).
    assert [r.headers["idempotency-key"] for r in requests] == ['"frozen-1"'] * 2
    first_events = events_for(first, mid)
    assert first_events.count("lease_lost") == 1, first_events  # one loss, logged once
    assert not {"delivered", "retried", "dead", "released"} & set(first_events), first_events
    second_events = events_for(second, mid)
    assert "rescued" in second_events
    assert "delivered" in second_events


def test_attempts_spent_while_running_end_dead_through_the_rescuer(
    database_url: str, fleet: Fleet
) -> None:
    hold = HoldFirst()
    with Receiver(hold) as receiver:
        try:
            mid = enqueue(database_url, f"{receiver.url}/hook", "spent-1", max_attempts=1)
            first = fleet.start(database_url, *PROCESS_ARGS)
            receiver.wait_for(1, timeout=20)
            first.signal(signal.SIGKILL)
            assert first.wait(timeout=10) == -signal.SIGKILL
        finally:
            hold.release.set()
        owner_a = scalar(
            database_url, "SELECT lease_owner FROM outbox.messages WHERE id = %s", (mid,)
        )
        assert first.owns(owner_a)
        wait_until(lease_expired(database_url, mid), timeout=15, what="the lease to expire")
        second = fleet.start(database_url, *PROCESS_ARGS, "--drain")
        assert second.wait(timeout=30) == 0, second.describe()
        requests = list(receiver.requests)

    assert len(requests) == 1  # the budget was spent: never sent again
    ((state, attempts, lease_owner, last_status, last_error, completed),) = query(
        database_url,
        "SELECT state, attempts, lease_owner, last_status, last_error, completed_at IS NOT NULL"
        " FROM outbox.messages WHERE id = %s",
        (mid,),
    )
    assert (state, attempts, lease_owner, last_status, completed) == ("dead", 1, None, None, True)
    assert "lease" in last_error
    assert query(
        database_url, "SELECT attempt, owner, outcome, error_class FROM outbox.attempts"
    ) == [(1, owner_a, "lease_expired", "lease_expired")]
    rescued = [e for e in second.events() if e["event"] == "rescued"]
    assert [(e["message_id"], e["state"]) for e in rescued] == [(mid, "dead")]
    assert events_for(second, mid) == ["rescued"]


class Recorder(EventLog):
    """Keeps every event in memory, for assertions."""

    def __init__(self) -> None:
        super().__init__(stream=io.StringIO(), format="json", level="debug")
        self.events: list[dict[str, Any]] = []

    def event(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})


async def _until(predicate: Callable[[], bool], *, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")
        await asyncio.sleep(0.05)


async def test_a_flush_blocked_past_the_lock_timeout_records_the_outcome_once(
    database_url: str,
) -> None:
    db = Db(database_url)
    hold = HoldFirst()
    log = Recorder()
    cfg = fast_config(lock_timeout=0.2)  # lease 3 s, statement timeout 0.5 s
    with Receiver(hold) as receiver:
        mid = db.enqueue("flush-1", receiver.url)
        dispatcher = Dispatcher(db.url, cfg, log=log)
        task = asyncio.create_task(dispatcher.run())

        def flush_errors() -> int:
            return sum(
                1 for e in log.events if e["event"] == "db_error" and e["operation"] == "complete"
            )

        try:
            await asyncio.to_thread(receiver.wait_for, 1, 10.0)
            # Every statement writing attempt rows (complete, rescue) now waits for
            # this lock and gives up after lock_timeout.
            async with await psycopg.AsyncConnection.connect(db.url) as locker:
                await locker.execute("LOCK TABLE outbox.attempts IN ACCESS EXCLUSIVE MODE")
                locked_at = time.monotonic()
                hold.release.set()  # the response (200) arrives; its flush is blocked
                await _until(lambda: flush_errors() >= 3, seconds=15, what="failed flushes")
                # Hold it past a whole lease: the heartbeat keeps the lease alive
                # while the outcome waits to be written.
                await asyncio.sleep(max(0.0, cfg.lease + 0.5 - (time.monotonic() - locked_at)))
                assert db.query(
                    "SELECT state, lease_owner, attempts, lease_until > now()"
                    " FROM outbox.messages WHERE id = %s",
                    mid,
                ) == [("running", dispatcher.owner, 1, True)]
                assert dispatcher.stats.delivered == 0
                await locker.rollback()
            await _until(
                lambda: dispatcher.stats.delivered == 1, seconds=15, what="the outcome write"
            )
        finally:
            hold.release.set()
            dispatcher.stop()
            async with asyncio.timeout(20):
                await task
        requests = list(receiver.requests)

    assert len(requests) == 1
    assert db.query("SELECT count(*) FROM outbox.messages") == [(0,)]
    assert db.query("SELECT id, attempts, last_status FROM outbox.delivered") == [(mid, 1, 200)]
    assert db.query("SELECT message_id, attempt, outcome, status, owner FROM outbox.attempts") == [
        (mid, 1, "delivered", 200, dispatcher.owner)
    ]
    errors = [e for e in log.events if e["event"] == "db_error" and e["operation"] == "complete"]
    assert {(e["sqlstate"], e["transient"]) for e in errors} <= {
        ("55P03", True),  # lock_not_available: lock_timeout
        ("57014", True),  # query_canceled: statement_timeout
    }
    assert dispatcher.stats.lease_lost == 0
    assert [e["event"] for e in log.events if e.get("message_id") == mid] == [
        "claimed",
        "delivered",
    ]


async def test_a_stale_outcome_flushed_after_a_reclaim_does_not_cost_the_new_attempt(
    database_url: str,
) -> None:
    """The database refuses the dispatcher's writes (completion, heartbeat) for a
    while: its first outcome waits in the flusher's retries, its lease runs out,
    and its own rescuer and claimer (which got through first) take the message
    again as attempt 2. When the stale attempt-1 outcome is finally written it is
    fenced out, and must leave attempt 2, in flight meanwhile, alone."""
    outage = threading.Event()
    outage.set()
    written: list[tuple[int, ...]] = []

    class WritesFail(Store):
        async def complete(
            self, owner: str, batch: Sequence[Completion]
        ) -> tuple[set[int], dict[int, str]]:
            if outage.is_set():
                raise psycopg.OperationalError("simulated: the connection was lost")
            result = await super().complete(owner, batch)
            written.append(tuple(c.attempt for c in batch))
            return result

        async def renew(self, owner: str, held: Sequence[tuple[int, int]]) -> set[int]:
            if outage.is_set():
                raise psycopg.OperationalError("simulated: the connection was lost")
            return await super().renew(owner, held)

    db = Db(database_url)
    second = threading.Event()

    def respond(req: Received) -> Reply:
        if len(receiver.requests) >= 2:
            second.wait(10)  # attempt 2 stays in flight until the test lets it finish
        return Reply()

    log = Recorder()
    with Receiver(respond) as receiver:
        mid = db.enqueue("stale-1", receiver.url)
        config = fast_config()
        dispatcher = Dispatcher(db.url, config, log=log, store=WritesFail(db.url, config))
        task = asyncio.create_task(dispatcher.run())
        try:
            await asyncio.to_thread(receiver.wait_for, 1, 10.0)
            await _until(
                lambda: any(e["event"] == "db_error" for e in log.events),
                seconds=10,
                what="a failed flush",
            )
            db.expire(mid)  # the lease ran out during the outage
            await asyncio.to_thread(receiver.wait_for, 2, 10.0)  # rescued and re-claimed
            outage.clear()
            await _until(lambda: (1,) in written, seconds=10, what="the stale outcome")
            second.set()
            await _until(
                lambda: db.query("SELECT count(*) FROM outbox.delivered") == [(1,)],
                seconds=10,
                what="the delivery",
            )
        finally:
            outage.clear()
            second.set()
            dispatcher.stop()
            async with asyncio.timeout(20):
                await task
        requests = len(receiver.requests)

    assert db.query("SELECT id, attempts, last_status FROM outbox.delivered") == [(mid, 2, 200)]
    assert requests == 2
    assert db.query("SELECT attempt, outcome, owner FROM outbox.attempts ORDER BY attempt") == [
        (1, "lease_expired", dispatcher.owner),
        (2, "delivered", dispatcher.owner),
    ]
    assert dispatcher.stats.lease_lost == 1
