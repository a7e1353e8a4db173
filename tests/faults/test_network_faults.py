"""The network between a dispatcher and PostgreSQL fails; nothing is lost or done twice.

In-process dispatchers reach the test's database through :class:`TcpProxy`, which
cuts connections on command (all of them, or exactly the one that sends a claim,
a renewal or an outcome batch, before it runs or after it committed), refuses
new ones, or stalls every byte. The receiver dedupes by idempotency key with
:class:`outbox.receiver.Inbox`, applying each key's effect in the same transaction
as its claim, as the receiver half documents.

After each fault the invariants are:

- every message is delivered (moved to ``delivered``, none ready, running or dead);
- its attempt rows are numbered 1..attempts, and exactly the last one succeeded;
- each key's effect happened exactly once at the deduping receiver, and a key
  reached the receiver more than once only if its message took more attempts;
- the dispatcher did not crash (``run`` returned, no internal error) and logged
  the database errors, so the fault really hit it.

Timing: the lease is 6 s (the shortest the validator accepts with 2 s requests
and 1 s statements, rounded up); a claim whose answer is lost waits that long
before the rescuer hands its messages on.
"""

from __future__ import annotations

import asyncio
import collections
import io
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import psycopg_pool
import pytest

from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog
from dispatchers.runtime.reporting import Stats
from outbox.receiver import Inbox, idempotency_key
from tests.dispatching import fast_config
from tests.faults.tcp_proxy import TcpProxy, proxy_target, through
from tests.processes import enqueue_many, query
from tests.receiver import Received, Receiver, Reply

pytestmark = pytest.mark.timeout(60)

# How each dispatcher statement is called on the wire: by the name it is prepared
# under (claim and claim_uncapped; complete and complete_delivered).
CLAIM = b"EXECUTE outbox_claim"
RENEW = b"EXECUTE outbox_renew_"
COMPLETE = b"EXECUTE outbox_complete"


THROUGH_A_PROXY = {
    "lease": 6.0,
    "request_timeout": 2.0,
    "connect_timeout": 1.0,
    "statement_timeout": 1.0,
    "claim_timeout": 1.0,
    "db_connect_timeout": 1.0,
    "rescue_interval": 0.5,
    "concurrency": 16,
    "batch_size": 16,
}
"""Bounds for a dispatcher that reaches the database through the proxy."""


# -- the database, through the proxy ------------------------------------------------


@pytest.fixture
def proxy(database_url: str) -> Iterator[TcpProxy]:
    with TcpProxy(proxy_target(database_url)) as proxy:
        yield proxy


# -- a receiver that applies each key's effect once -----------------------------------


class DedupingReceiver:
    """An HTTP receiver that claims each request's key in an :class:`Inbox` and
    records the effect in the same transaction (in the test database, reached
    directly, never through the proxy)."""

    def __init__(self, database_url: str, *, delay: float = 0.0) -> None:
        self.delay = delay
        self.inbox = Inbox(schema="receiver")
        with psycopg.connect(database_url) as conn:
            self.inbox.ensure_schema(conn)
            conn.execute("CREATE TABLE receiver.effects (key text NOT NULL)")
        self.pool = psycopg_pool.ConnectionPool(
            database_url, min_size=2, max_size=16, open=False, name="receiver"
        )
        self.http = Receiver(self.respond)

    def respond(self, request: Received) -> Reply:
        key = idempotency_key(request.headers)
        assert key is not None
        with self.pool.connection() as conn, conn.transaction():
            if self.inbox.claim(conn, key):
                conn.execute("INSERT INTO receiver.effects (key) VALUES (%s)", (key,))
        return Reply(delay=self.delay)

    @property
    def url(self) -> str:
        return self.http.url

    def requests(self) -> list[Received]:
        with self.http.lock:
            return list(self.http.requests)

    def __enter__(self) -> DedupingReceiver:
        self.pool.open(wait=True, timeout=10)
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)
        self.pool.close(timeout=5)


@pytest.fixture
def receiver(database_url: str) -> Iterator[DedupingReceiver]:
    with DedupingReceiver(database_url) as receiver:
        yield receiver


# -- running a dispatcher and checking the invariants -----------------------------------


@dataclass
class Run:
    dispatcher: Dispatcher
    stats: Stats
    events: list[dict[str, Any]]
    seconds: float
    #: the same span by the wall clock, which the database's now() and so every
    #: lease follow (the monotonic clock does not step when the host's is set)
    wall_seconds: float

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def db_errors(self, operation: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.named("db_error")
            if operation is None or e.get("operation") == operation
        ]


async def drain(url: str, cfg: DispatcherConfig, *, within: float = 40.0) -> Run:
    """Run one dispatcher with ``drain`` until it returns (bounded)."""
    stream = io.StringIO()
    dispatcher = Dispatcher(url, cfg, log=EventLog(stream=stream, format="json"))
    start, wall_start = time.monotonic(), time.time()
    try:
        async with asyncio.timeout(within):
            stats = await dispatcher.run(drain=True)
    finally:
        events = [json.loads(line) for line in stream.getvalue().splitlines()]
    return Run(dispatcher, stats, events, time.monotonic() - start, time.time() - wall_start)


def check_invariants(
    database_url: str, ids: list[int], keys: list[str], receiver: DedupingReceiver, run: Run
) -> collections.Counter[str]:
    """Assert the invariants of the module docstring; return the keys the receiver
    saw more than once (with their counts)."""
    assert not run.named("internal_error"), run.named("internal_error")
    assert not run.named("outcome_dropped"), run.named("outcome_dropped")
    assert query(database_url, "SELECT state, count(*) FROM outbox.messages GROUP BY 1") == []
    delivered = dict(query(database_url, "SELECT id, attempts FROM outbox.delivered"))
    assert sorted(delivered) == sorted(ids)
    assert query(
        database_url, "SELECT count(*), count(DISTINCT idempotency_key) FROM outbox.delivered"
    ) == [(len(ids), len(ids))]

    attempts = query(
        database_url,
        "SELECT message_id, array_agg(CAST(attempt AS integer) ORDER BY attempt),"
        " array_agg(outcome ORDER BY attempt) FROM outbox.attempts GROUP BY message_id",
    )
    assert len(attempts) == len(ids)
    for mid, numbers, outcomes in attempts:
        assert numbers == list(range(1, delivered[mid] + 1)), (mid, numbers)
        assert outcomes[-1] == "delivered" and outcomes.count("delivered") == 1, (mid, outcomes)

    effects = collections.Counter(
        row[0] for row in query(database_url, "SELECT key FROM receiver.effects")
    )
    assert effects == collections.Counter(keys), "each key's effect exactly once"

    by_key = dict(query(database_url, "SELECT idempotency_key, attempts FROM outbox.delivered"))
    seen = collections.Counter(idempotency_key(r.headers) or "" for r in receiver.requests())
    assert set(seen) == set(keys)
    for key, count in seen.items():
        assert count <= by_key[key], (key, count, by_key[key])
    return collections.Counter({k: n for k, n in seen.items() if n > 1})


def outcome_attempts(database_url: str) -> dict[str, int]:
    return dict(query(database_url, "SELECT outcome, count(*) FROM outbox.attempts GROUP BY 1"))


# -- cuts at random moments --------------------------------------------------------------


async def test_connections_cut_every_300ms_during_drain_lose_nothing(
    database_url: str, proxy: TcpProxy
) -> None:
    total = 1000
    keys = [f"cut-often-{i:04d}" for i in range(total)]
    with DedupingReceiver(database_url, delay=0.04) as receiver:
        ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
        stop = threading.Event()
        cuts: list[int] = []

        def cutter() -> None:
            # every 300 ms cut every connection; every fourth time also refuse the
            # reconnections for half a second. Stop after 5 s, so the drain can end.
            deadline = time.monotonic() + 5.0
            while not stop.wait(0.3) and time.monotonic() < deadline:
                if len(cuts) % 4 == 3:
                    proxy.refuse(0.5)
                cuts.append(proxy.cut())

        thread = threading.Thread(target=cutter, name="cutter", daemon=True)
        thread.start()
        try:
            run = await drain(
                through(proxy, database_url),
                fast_config(THROUGH_A_PROXY, concurrency=32, batch_size=32),
            )
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, 5)
        duplicates = check_invariants(database_url, ids, keys, receiver, run)

    assert sum(cuts) >= 5, cuts  # connections really were open and cut
    assert run.db_errors(), "no database error logged: did the cuts miss?"
    assert proxy.stats.refused > 0
    assert run.stats.delivered + run.stats.lease_lost >= total
    print(
        f"\ncut every 300 ms: {len(cuts)} cuts, {sum(cuts)} connections, "
        f"{proxy.stats.refused} refused, {len(run.db_errors())} db_error events, "
        f"{sum(duplicates.values()) - len(duplicates)} duplicate deliveries, "
        f"attempts {outcome_attempts(database_url)}, {run.seconds:.1f} s"
    )


# -- cuts at exactly the wrong moment ------------------------------------------------------


@pytest.mark.parametrize("mode", ["request", "reply"])
async def test_claim_cut_before_it_runs_or_after_it_commits_loses_nothing(
    database_url: str, proxy: TcpProxy, receiver: DedupingReceiver, mode: str
) -> None:
    """A claim whose answer is lost holds its messages until the lease expires;
    then the rescuer hands them on. They were never sent, so the receiver sees
    each key once."""
    keys = [f"claim-{mode}-{i:02d}" for i in range(40)]
    ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
    proxy.cut_on(CLAIM, mode="request" if mode == "request" else "reply")
    run = await drain(through(proxy, database_url), fast_config(THROUGH_A_PROXY))
    duplicates = check_invariants(database_url, ids, keys, receiver, run)

    assert proxy.rules_pending() == 0 and proxy.stats.cut_on == 1
    assert len(run.db_errors("claim")) == 1, run.db_errors()
    assert not duplicates
    lost = query(
        database_url,
        "SELECT message_id, owner FROM outbox.attempts WHERE outcome = 'lease_expired'",
    )
    if mode == "request":
        # the claim never ran: nothing was held, every message took one attempt
        assert lost == []
        assert query(database_url, "SELECT DISTINCT attempts FROM outbox.delivered") == [(1,)]
    else:
        # the claim committed unseen: its messages were rescued, then delivered
        assert 1 <= len(lost) <= fast_config(THROUGH_A_PROXY).batch_size
        assert {row[1] for row in lost} == {run.dispatcher.owner}
        assert sorted(e["message_id"] for e in run.named("rescued")) == sorted(r[0] for r in lost)
        # a lease is measured by the database's clock, the wall clock of this host
        assert run.wall_seconds >= fast_config(THROUGH_A_PROXY).lease


async def test_renewal_cut_before_it_runs_and_after_it_commits_loses_no_lease(
    database_url: str, proxy: TcpProxy
) -> None:
    """The first renewal is cut before it runs, the second after it committed,
    while deliveries are in flight (back to back for about 8 s, renewals every
    2 s); the next renewal comes in time (a lease outlasts any delivery), so no
    lease is lost and every key is sent once."""
    keys = [f"renew-{i:02d}" for i in range(60)]
    with DedupingReceiver(database_url, delay=1.5) as receiver:
        ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
        proxy.cut_on(RENEW, mode="request")
        proxy.cut_on(RENEW, mode="reply")
        run = await drain(
            through(proxy, database_url),
            fast_config(THROUGH_A_PROXY, concurrency=12, batch_size=12),
        )
        duplicates = check_invariants(database_url, ids, keys, receiver, run)

    assert proxy.stats.cut_on == 2
    assert len(run.db_errors("renew")) == 2, run.db_errors()
    assert run.stats.renewals >= 1  # the third renewal went through
    assert not run.named("lease_lost") and not run.named("rescued")
    assert not duplicates
    assert query(database_url, "SELECT DISTINCT attempts FROM outbox.delivered") == [(1,)]


@pytest.mark.parametrize("mode", ["request", "reply"])
async def test_outcome_flush_cut_before_it_runs_or_after_it_commits_records_once(
    database_url: str, proxy: TcpProxy, receiver: DedupingReceiver, mode: str
) -> None:
    """The outcome batch is written again after the cut. When the first write had
    committed, the second matches nothing (the fence), so each outcome and its
    attempt row are recorded once and no message is sent again; the dispatcher
    finds its outcomes recorded and counts them delivered, not lost."""
    keys = [f"flush-{mode}-{i:02d}" for i in range(40)]
    ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
    proxy.cut_on(COMPLETE, mode="request" if mode == "request" else "reply", times=2)
    run = await drain(through(proxy, database_url), fast_config(THROUGH_A_PROXY))
    duplicates = check_invariants(database_url, ids, keys, receiver, run)

    assert proxy.stats.cut_on == 2
    assert len(run.db_errors("complete")) == 2, run.db_errors()
    assert not duplicates
    assert not run.named("rescued")
    assert query(database_url, "SELECT DISTINCT attempts FROM outbox.delivered") == [(1,)]
    assert outcome_attempts(database_url) == {"delivered": len(ids)}
    # a retry that matches nothing because the first write committed is no lost lease
    assert run.stats.delivered == len(ids)
    assert not run.named("lease_lost")


# -- a stalled network ----------------------------------------------------------------------


async def test_stall_past_statement_timeout_is_abandoned_at_the_bound(
    database_url: str, proxy: TcpProxy
) -> None:
    """Every byte stops, both ways, for longer than the statement timeout while
    deliveries are in flight and outcomes are due. PostgreSQL's own
    statement_timeout cannot help (the statement or its answer is stuck on the
    way), so the dispatcher must give up on the connection itself, log it, and
    carry on once the network is back."""
    # a longer lease than elsewhere: outcomes retried after the stall land well
    # before the leases of the deliveries they record could expire
    cfg = fast_config(THROUGH_A_PROXY, concurrency=8, batch_size=8, lease=9.0)
    keys = [f"stall-{i:02d}" for i in range(40)]
    stall = 4.0
    with DedupingReceiver(database_url, delay=0.5) as receiver:
        ids = enqueue_many(database_url, f"{receiver.url}/hook", keys)
        task = asyncio.create_task(drain(through(proxy, database_url), cfg))
        await asyncio.to_thread(receiver.http.wait_for, 8, 10)
        stalled_at = datetime.now(UTC)
        await asyncio.to_thread(proxy.stall, stall)
        run = await task
        duplicates = check_invariants(database_url, ids, keys, receiver, run)

    assert proxy.stats.stalls == 1
    assert run.seconds > stall
    # Given up on while the network was still stalled: a statement is bounded on
    # the client too, not only by the server's statement_timeout.
    during = [
        e
        for e in run.db_errors()
        if stalled_at <= datetime.fromisoformat(e["ts"]) < stalled_at + timedelta(seconds=stall)
    ]
    assert during, f"no database error while stalled: {run.db_errors()}"
    # a statement that ran but whose answer was stuck may have held its messages
    # until the lease expired; they were never sent, so nothing reached the receiver twice
    assert not duplicates
