"""Every statement the dispatcher and the library run, planned as they are, on the
server at hand.

These run on every server installed (14 to 18, see ``tests/servers.py``), whatever
the run's choice: a plan that is cheap on one build can cost seconds on another. With a backlog of
20,000 messages, each statement must reach its rows through its indexes, in the
generic plan the dispatcher keeps per connection for the per-batch statements,
and no execution may be JIT-compiled, even where the server has JIT on (Debian's
and the managed services' builds): the last tests show that there, without the
store's session statement, the claim would be. The library runs in the
application's transaction, whose settings it leaves alone: its statements must
stay below the server's JIT thresholds there, planned for their values or
generically.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

import psycopg
import pytest

from dispatchers.bench.env import bench_queries
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.store.messages import Completion
from dispatchers.store.postgres import REPLAN_FLOOR, Store
from outbox import Outbox
from outbox.endpoints import Endpoints
from tests.plans import backlog, explain, history_with_rows, indexes, jit_available, seq_scans

pytestmark = pytest.mark.every_server  # each installed version, not only the run's

LONE = "https://d0.example:443"


def _batch(state: str, outcome: str) -> list[Completion]:
    now = datetime.now(UTC)
    return [
        Completion(
            id=i,
            attempt=1,
            state=state,
            outcome=outcome,
            sent=True,
            status=200 if state == "delivered" else 500,
            delay=0.0 if state == "delivered" else 5.0,
            started_at=now,
            duration_ms=3,
        )
        for i in range(1, 101)
    ]


def _claim(
    store: Store, *, capped: bool, alone: str | None = None, lone: bool = False
) -> tuple[Any, dict[str, Any]]:
    return store.claim_statement(
        "owner-x", 100, capped=capped, busy={LONE: 3}, alone=alone, lone=lone
    )


# (name, the statement and its parameters, destinations, claimed first, indexes it must use)
PREPARED = {
    "claim_uncapped": (
        lambda s: _claim(s, capped=False),
        100,
        False,
        {"messages_claimable_idx", "messages_pkey"},
    ),
    "claim_uncapped alone": (
        lambda s: _claim(s, capped=False, alone=LONE),
        1,
        False,
        {"messages_claimable_idx", "messages_pkey"},
    ),
    "claim_lone": (
        lambda s: _claim(s, capped=False, alone=LONE, lone=True),
        1,
        False,
        {"messages_claimable_idx", "messages_pkey"},
    ),
    "claim": (lambda s: _claim(s, capped=True), 100, False, {"messages_claimable_idx"}),
    "claim alone": (
        lambda s: _claim(s, capped=True, alone=LONE),
        1,
        False,
        {"messages_claimable_idx", "messages_pkey"},
    ),
    "complete_delivered": (
        lambda s: s.complete_statement("owner-1", _batch("delivered", "delivered")),
        1,
        True,
        {"messages_pkey"},
    ),
    "complete": (
        lambda s: s.complete_statement("owner-1", _batch("ready", "retry")),
        1,
        True,
        {"messages_pkey"},
    ),
    "renew": (
        lambda s: (
            s.queries["renew"],
            {"owner": "owner-1", "lease_s": 30, "ids": list(range(1, 101)), "attempts": [1] * 100},
        ),
        1,
        True,
        {"messages_pkey"},
    ),
}


@pytest.mark.parametrize("webhooks", [False, True], ids=["plain", "webhooks"])
@pytest.mark.parametrize("name", list(PREPARED))
@pytest.mark.slow
def test_each_prepared_statement_reaches_its_rows_by_index_without_jit(
    database_url: str, name: str, webhooks: bool
) -> None:
    # plain messages to their origins, or webhooks to 2,000 endpoints: the
    # endpoints are looked up one by one, never read whole
    make, destinations, running, expected = PREPARED[name]
    backlog(
        database_url,
        running=running,
        destinations=destinations,
        endpoints=2000 if webhooks else 0,
    )
    store = Store(database_url, DispatcherConfig())
    statement, params = make(store)
    if webhooks and "alone" in params:
        params["alone"] = params["alone"] and "endpoint:1"
    plan = explain(database_url, statement, params, prepared=True, store=store)
    assert seq_scans(plan, "messages") == [], plan
    if webhooks:
        assert seq_scans(plan, "endpoints") == [], plan
    assert expected <= indexes(plan), (expected, indexes(plan))
    assert "JIT" not in plan, plan


def test_the_claim_takes_what_it_reads_by_index_in_its_plan(database_url: str) -> None:
    # The generic plan above is the one the dispatcher runs: it claims from the
    # backlog (rolled back), with every message of the batch.
    backlog(database_url, running=False, destinations=100)
    store = Store(database_url, DispatcherConfig())
    statement, params = _claim(store, capped=False)
    plan = explain(database_url, statement, params, prepared=True, store=store)
    assert plan["Plan"]["Actual Rows"] == 100, plan["Plan"]


def _history(url: str, rows: int) -> None:
    with psycopg.connect(url) as conn:
        # the day before the first partition made ahead, as a dispatcher that ran
        # yesterday has it: the rows written over the last hours land in their
        # day's partition whatever the hour (before 05:33 UTC some are yesterday's)
        for parent in ("attempts", "delivered"):
            (lower,) = conn.execute(
                "SELECT min(lower) FROM outbox.history_partitions()"
                " WHERE parent = %s AND NOT is_default",
                (parent,),
            ).fetchone() or (None,)
            conn.execute(
                "SELECT outbox._history_partition_add(%s, %s - interval '1 day', %s)",
                (parent, lower, lower),
            )
        statement = bench_queries("outbox")["seed_history"]
        conn.execute(statement, {"target": "https://example.com", "rows": rows, "body": b""})
        conn.execute("UPDATE outbox.delivered SET completed_at = completed_at - interval '30 days'")
        conn.execute("ANALYZE outbox.delivered, outbox.message_keys, outbox.attempts")


@pytest.mark.slow
def test_the_occasional_statements_reach_their_rows_by_index_without_jit(
    database_url: str,
) -> None:
    # rescue, the drain check and retention are planned at each run, for their
    # values and the statistics of the time: a backlog with 1,000 leases expired,
    # and a month-old history, analyzed
    backlog(database_url, running=False)
    _history(database_url, 20_000)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'gone',"
            " lease_until = now() - interval '1 minute' WHERE id <= 1000"
        )
        conn.execute("ANALYZE outbox.messages")
        # below the partitions of a day (migration 0032): the default partition's
        floor = conn.execute(
            "SELECT min(lower) FROM outbox.history_partitions() WHERE parent = 'delivered'"
        ).fetchone()
    assert floor is not None
    store = Store(database_url, DispatcherConfig())
    q = store.queries
    cases = {
        "rescue": ({"limit": 1000}, {"messages_lease_idx", "messages_pkey"}),
        "retention": (
            # a batch small beside the history, as it is on a server that keeps one
            {
                "retention_s": 7 * 86400,
                "limit": 100,
                "delivered_floor": floor[0],
                "attempts_floor": floor[0],
            },
            {"delivered_default_completed_at_idx", "delivered_default_pkey"},
        ),
    }
    # the partitions of the history that hold rows (one made ahead, or today's few
    # minutes after midnight, may be read whole: tests.plans.FEW)
    history = sorted(history_with_rows(database_url))
    assert "delivered_default" in history
    for name, (params, expected) in cases.items():
        plan = explain(database_url, q[name], params, prepared=False, store=store)
        assert seq_scans(plan, "messages") == [], (name, plan)
        for table in history:
            assert seq_scans(plan, table) == [], (name, table, plan)
        assert expected <= indexes(plan), (name, expected, indexes(plan))
        assert "JIT" not in plan, (name, plan)
    # The drain check counts what is due, running and scheduled: the ready
    # messages are read whole (by index or not, the planner's call), the few
    # running ones by the lease index.
    plan = explain(database_url, q["work_remaining"], {}, prepared=False, store=store)
    assert "messages_lease_idx" in indexes(plan), indexes(plan)
    assert "JIT" not in plan, plan


def test_on_a_server_with_jit_the_claim_would_be_compiled_without_the_session_statement(
    database_url: str,
) -> None:
    # What the tests above guard against: the generic plan's estimate passes every
    # JIT threshold once the backlog is deep, and then each claim is compiled.
    if not jit_available(database_url):
        pytest.skip("this server cannot JIT-compile (a build without LLVM, or jit off)")
    backlog(database_url, running=False)
    store = Store(database_url, DispatcherConfig())
    statement, params = _claim(store, capped=False, alone=LONE)
    plan = explain(database_url, statement, params, prepared=True)
    assert "JIT" in plan, plan["Plan"]["Total Cost"]


async def test_plans_made_on_an_empty_outbox_are_made_again_once_it_has_grown(
    database_url: str,
) -> None:
    # A dispatcher started on an idle outbox plans its statements for an empty
    # table; a backlog arriving later must not be claimed by reading it whole.
    store = Store(database_url, DispatcherConfig())
    await store.open()
    await store.pool.resize(min_size=1, max_size=1)  # one connection: its plans
    try:
        assert (await store.claim("owner", 10)).messages == []
        backlog(database_url, running=False)
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                "SELECT pg_relation_size('outbox.messages') / current_setting('block_size')::int"
            ).fetchone()
            assert row is not None and row[0] >= REPLAN_FLOOR, row
        assert store.replans == 0
        assert len((await store.claim("owner", 10)).messages) == 10  # sees the growth
        assert len((await store.claim("owner", 10)).messages) == 10  # planned again
        assert store.replans == 1
        statement, params = store.claim_statement("owner", 10, capped=False)
        async with store.pool.connection() as conn:
            cur = psycopg.AsyncClientCursor(conn)
            await cur.execute("EXPLAIN (FORMAT JSON) " + statement.prepared.execute, params)
            plan = (await cur.fetchone())[0][0]  # type: ignore[index]
        assert seq_scans(plan, "messages") == [], plan
        assert "messages_claimable_idx" in indexes(plan), indexes(plan)
    finally:
        await store.close()


class _Recording(psycopg.Cursor[Any]):
    """A cursor that keeps what the library executes through it."""

    seen: ClassVar[list[tuple[bytes, dict[str, Any]]]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> _Recording:
        _Recording.seen.append((query, params))
        super().execute(query, params, **kwargs)
        return self


def test_the_librarys_statements_stay_below_the_jit_thresholds_in_the_applications_session(
    database_url: str,
) -> None:
    # A backlog, 300 endpoints of which 100 take the event; what enqueue and
    # publish execute is recorded, then planned under the server's own settings.
    backlog(database_url, running=False)
    with psycopg.connect(database_url) as conn:
        for i in range(300):
            event_type = "order.created" if i % 3 == 0 else "other"
            Endpoints().add(conn, url=f"https://e{i}.example/hook", event_types=[event_type])
        conn.execute("ANALYZE")
    box = Outbox()
    _Recording.seen.clear()
    with psycopg.connect(database_url, cursor_factory=_Recording) as conn:
        box.enqueue(conn, url="https://x.example/a", idempotency_key="lib-1", json={"a": 1})
        box.publish(conn, "order.created", {"a": 1}, idempotency_key="event-1")
    by_query = {q[name].query: q[name] for q in [box.queries] for name in q.names()}
    ran = [(by_query[query], params) for query, params in _Recording.seen if query in by_query]
    assert {statement.name for statement, _ in ran} >= {"enqueue_notify", "publish_notify"}, ran
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT current_setting('jit_above_cost')::float").fetchone()
        assert row is not None
        threshold = row[0]
    for statement, params in ran:
        for prepared in (False, True):
            plan = explain(database_url, statement, params, prepared=prepared)
            assert "JIT" not in plan, (statement.name, prepared, plan)
            cost = plan["Plan"]["Total Cost"]
            assert cost < threshold / 10, (statement.name, prepared, cost)
