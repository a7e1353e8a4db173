"""The cheaper claim and completion statements the Store picks for the common case,
and the plans that keep every drain statement's cost proportional to its batch."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from dispatchers.delivery.jobs import Job
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.unseal import Opener
from dispatchers.store import claim as claims_module
from dispatchers.store.messages import Completion
from dispatchers.store.postgres import Store
from outbox import Outbox
from outbox.destinations import Destinations
from outbox.endpoints import Endpoints
from tests.plans import backlog, explain, seq_scans

URL = "https://example.com/hook"


def query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


def enqueue(url: str, *keys: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [Outbox().enqueue(conn, url=URL, idempotency_key=k, json={"k": k}) for k in keys]


def success(job: Job, **overrides: Any) -> Completion:
    fields: dict[str, Any] = {
        "id": job.id,
        "attempt": job.attempts,
        "state": "delivered",
        "outcome": "delivered",
        "sent": True,
        "status": 200,
        "started_at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        "duration_ms": 7,
        "excerpt": "ok",
        "endpoint_id": job.endpoint_id,
    }
    fields.update(overrides)
    return Completion(**fields)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = Store(database_url, DispatcherConfig(lease=30.0))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def plan(url: str, statement: str, params: dict[str, Any]) -> str:
    with psycopg.connect(url) as conn:
        text = psycopg.ClientCursor(conn).mogrify(statement, params)
        return "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + text).fetchall())


# -- completion ------------------------------------------------------------------


async def test_lean_completion_writes_what_the_general_statement_writes(
    database_url: str, store: Store
) -> None:
    lean_id, general_id = enqueue(database_url, "lean", "general")
    jobs = {j.id: j for j in (await store.claim("owner-a", 2)).messages}
    assert await store.complete("owner-a", [success(jobs[lean_id])]) == ({lean_id}, {})
    # the same outcome through the general statement: a batch that also holds an
    # outcome of no message at all (which changes nothing) does not qualify
    nothing = Completion(id=-1, attempt=1, state="ready", outcome="released", sent=False)
    batch = [success(jobs[general_id]), nothing]
    assert store.complete_statement("owner-a", batch)[0] is store.queries["complete"]
    assert await store.complete("owner-a", batch) == ({general_id}, {})

    delivered = query(
        database_url,
        "SELECT id, target, endpoint_id, url, method, headers, body, content_type, event_type,"
        " ordering_key, attempts, max_attempts, last_status, created_at IS NOT NULL,"
        " completed_at IS NOT NULL FROM outbox.delivered ORDER BY id",
    )
    assert [d[0] for d in delivered] == [lean_id, general_id]
    assert delivered[0][1:6] == delivered[1][1:6]
    assert delivered[0][7:] == delivered[1][7:]
    assert delivered[0][-5:-2] == (1, 12, 200)
    attempts = query(
        database_url,
        "SELECT message_id, attempt, owner, started_at, duration_ms, status, outcome,"
        " error_class, error, response_excerpt FROM outbox.attempts ORDER BY message_id",
    )
    assert [a[0] for a in attempts] == [lean_id, general_id]
    assert attempts[0][1:] == attempts[1][1:]
    assert attempts[0][1:] == (
        1,
        "owner-a",
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        7,
        200,
        "delivered",
        None,
        None,
        "ok",
    )
    assert query(database_url, "SELECT count(*) FROM outbox.messages") == [(0,)]


async def test_lean_completion_updates_endpoints_and_slots_as_the_general_one_does(
    database_url: str, store: Store
) -> None:
    with psycopg.connect(database_url) as conn:
        endpoints = Endpoints()
        a = endpoints.add(conn, url=URL + "/a", event_types=["a"], max_concurrency=1)
        b = endpoints.add(conn, url=URL + "/b", event_types=["b"], max_concurrency=1)
        ids = {
            key: Outbox().publish(conn, key[0], {}, idempotency_key=key)[0]
            for key in ("a1", "a2", "b1", "b2")
        }
    jobs = {j.id: j for j in (await store.claim("owner-a", 10)).messages}
    assert set(jobs) == {ids["a1"], ids["b1"]}  # one each: the caps
    # both failing for an hour, then disabled while a1 and b1 were in flight,
    # in a way that left a2 and b2 waiting (ready)
    query(
        database_url,
        "UPDATE outbox.endpoints SET failure_streak = 3,"
        " failing_since = now() - interval '1 hour', enabled = false,"
        " disabled_reason = 'by hand', disabled_at = now() - interval '1 minute'"
        " RETURNING id",
    )
    lean = [success(jobs[ids["a1"]])]
    assert store.complete_statement("owner-a", lean)[0] is store.queries["complete_delivered"]
    assert await store.complete("owner-a", lean) == ({ids["a1"]}, {})
    nothing = Completion(id=-1, attempt=1, state="ready", outcome="released", sent=False)
    general = [success(jobs[ids["b1"]]), nothing]
    assert store.complete_statement("owner-a", general)[0] is store.queries["complete"]
    assert await store.complete("owner-a", general) == ({ids["b1"]}, {})

    rows = query(
        database_url,
        "SELECT id, failure_streak, failing_since, last_success_at > now() - interval '1 minute',"
        " enabled, disabled_reason, disabled_at < now()"
        " FROM outbox.endpoints ORDER BY id",
    )
    assert [r[0] for r in rows] == [a.id, b.id]
    assert rows[0][1:] == rows[1][1:] == (0, None, True, False, "by hand", True)
    assert query(database_url, "SELECT id, state FROM outbox.messages ORDER BY id") == [
        (ids["a2"], "paused"),
        (ids["b2"], "paused"),
    ]
    assert query(
        database_url, "SELECT count(*) FROM outbox.destination_slots WHERE message_id IS NOT NULL"
    ) == [(0,)]


async def test_lean_completion_is_fenced_by_owner_attempt_and_state(
    database_url: str, store: Store
) -> None:
    (mid,) = enqueue(database_url, "fenced")
    (job,) = (await store.claim("owner-a", 1)).messages
    assert await store.complete("owner-b", [success(job)]) == (set(), {})
    assert await store.complete("owner-a", [success(job, attempt=job.attempts + 1)]) == (
        set(),
        {},
    )
    query(
        database_url,
        "UPDATE outbox.messages SET state = 'dead', lease_owner = NULL, lease_until = NULL"
        " WHERE id = %s RETURNING id",
        mid,
    )
    assert await store.complete("owner-a", [success(job)]) == (set(), {})
    assert query(database_url, "SELECT count(*) FROM outbox.delivered") == [(0,)]
    assert query(database_url, "SELECT count(*) FROM outbox.attempts") == [(0,)]
    assert query(database_url, "SELECT state, attempts FROM outbox.messages") == [("dead", 1)]


# -- claim -----------------------------------------------------------------------


async def test_claim_without_capped_endpoints_takes_one_cheap_statement(
    database_url: str, store: Store
) -> None:
    with psycopg.connect(database_url) as conn:
        endpoint = Endpoints().add(conn, url=URL, secret="whsec_" + "A" * 32)
        (webhook,) = Outbox().publish(conn, "order.paid", {"n": 1}, idempotency_key="w")
    (plain,) = enqueue(database_url, "plain")
    before = store.round_trips
    jobs = {j.id: j for j in (await store.claim("owner-a", 10)).messages}
    assert store.round_trips == before + 1
    assert set(jobs) == {webhook, plain}
    assert (jobs[webhook].endpoint_id, jobs[webhook].url) == (endpoint.id, URL)
    # the secret as stored (plain here: no key sealed it), opened after the claim
    assert (jobs[webhook].secrets, jobs[webhook].secret_keys) == (["whsec_" + "A" * 32], [None])
    assert (jobs[plain].endpoint_id, jobs[plain].secrets) == (None, None)
    opener = Opener(None)
    assert opener.job(jobs[webhook]).secrets == ("whsec_" + "A" * 32,)
    assert opener.job(jobs[plain]).secrets == ()


async def test_claim_with_a_capped_endpoint_takes_the_slots(
    database_url: str, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(database_url) as conn:
        endpoint = Endpoints().add(conn, url=URL, max_concurrency=1)
        first, second = (
            Outbox().publish(conn, "order.paid", {"n": i}, idempotency_key=f"c{i}")[0]
            for i in range(2)
        )
    plain, plain_2 = enqueue(database_url, "p1", "p2")
    monkeypatch.setattr(claims_module, "CAPPED_RECHECK", 0.0)  # try the cheap claim every time
    before = store.round_trips
    # the cheap claim passes the capped endpoint's messages over
    assert sorted(j.id for j in (await store.claim("owner-a", 2)).messages) == [plain, plain_2]
    assert store.round_trips == before + 1
    # it claims nothing more and says that caps exist: "claim" takes the rest
    assert [j.id for j in (await store.claim("owner-a", 10)).messages] == [first]
    assert store.round_trips == before + 3
    assert query(
        database_url,
        "SELECT message_id FROM outbox.destination_slots WHERE destination = %s",
        f"endpoint:{endpoint.id}",
    ) == [(first,)]
    assert (await store.claim("owner-a", 10)).messages == []  # the cap holds
    assert store.round_trips == before + 5
    # for CAPPED_RECHECK seconds after caps were seen, straight to "claim"
    monkeypatch.setattr(claims_module, "CAPPED_RECHECK", 60.0)
    assert (await store.claim("owner-a", 10)).messages == []
    assert (await store.claim("owner-a", 10)).messages == []
    assert store.round_trips == before + 8
    assert query(database_url, "SELECT state FROM outbox.messages WHERE id = %s", second) == [
        ("ready",)
    ]


# -- the short way, for a destination alone ----------------------------------------

HERE = "https://example.com:443"  # the destination of URL


async def prepared_names(store: Store) -> set[str]:
    async with store.pool.connection() as conn:
        cur = await conn.execute("SELECT name FROM pg_prepared_statements")
        return {str(row[0]) for row in await cur.fetchall()}


async def test_a_destination_alone_is_claimed_the_short_way(
    database_url: str, store: Store
) -> None:
    await store.pool.resize(min_size=1, max_size=1)  # one connection: its statements
    ids = enqueue(database_url, *(f"k{i}" for i in range(5)))
    before = store.round_trips
    assert [j.id for j in (await store.claim("owner-a", 3, alone=HERE)).messages] == ids[:3]
    assert [j.id for j in (await store.claim("owner-a", 3, alone=HERE)).messages] == ids[3:]
    assert (await store.claim("owner-a", 3, alone=HERE)).messages == []  # nothing due: nothing more
    assert store.round_trips == before + 3
    names = await prepared_names(store)
    assert store.queries["claim_lone"].prepared.name in names
    assert store.queries["claim_uncapped"].prepared.name not in names


async def test_the_short_way_defers_to_the_fair_claim_once_another_destination_is_due(
    database_url: str, store: Store
) -> None:
    here = enqueue(database_url, *(f"k{i}" for i in range(5)))
    with psycopg.connect(database_url) as conn:
        there = Outbox().enqueue(conn, url="https://other.example/x", idempotency_key="o", json={})
    before = store.round_trips
    claimed = [j.id for j in (await store.claim("owner-a", 4, alone=HERE)).messages]
    assert sorted(claimed) == sorted([*here[:3], there])  # shared, in turns
    assert store.round_trips == before + 2


async def test_the_short_way_defers_while_a_hold_is_on_its_destination(
    database_url: str, store: Store
) -> None:
    enqueue(database_url, "a", "b")
    query(
        database_url,
        "INSERT INTO outbox.destination_health (destination, state, blocked_until)"
        " VALUES (%s, 'held', now() + interval '1 hour') RETURNING 1",
        HERE,
    )
    before = store.round_trips
    assert (await store.claim("owner-a", 10, alone=HERE)).messages == []
    assert store.round_trips == before + 2  # the fair claim also passes it over


async def test_the_short_way_defers_to_the_slots_of_a_destination_with_a_policy(
    database_url: str, store: Store
) -> None:
    first, _ = enqueue(database_url, "a", "b")
    with psycopg.connect(database_url) as conn:
        Destinations().set(conn, URL, max_concurrency=1)
    before = store.round_trips
    # the short way defers, the cheap claim says a policy exists, "claim" takes a slot
    assert [j.id for j in (await store.claim("owner-a", 10, alone=HERE)).messages] == [first]
    assert store.round_trips == before + 3
    assert query(database_url, "SELECT message_id FROM outbox.destination_slots") == [(first,)]


def _taken(url: str, statement: Any, params: dict[str, Any]) -> list[int]:
    """The ids ``statement`` claims now, in a transaction rolled back."""
    with psycopg.connect(url) as conn:
        rows = psycopg.ClientCursor(conn).execute(statement.text, params).fetchall()
        conn.rollback()
    return [row[0] for row in rows if row[0] is not None]


@pytest.mark.parametrize("seed", range(8))
def test_the_short_way_takes_what_the_fair_claim_takes_for_a_destination_alone(
    database_url: str, seed: int
) -> None:
    # A destination alone with a mixed backlog: ordering keys (some held back by an
    # earlier message that runs), messages due later, some running already.
    rng = random.Random(seed)
    with psycopg.connect(database_url) as conn:
        box = Outbox()
        for i in range(rng.randint(5, 40)):
            box.enqueue(
                conn,
                url=URL,
                idempotency_key=f"m{i}",
                json={"i": i},
                # the first due at once, with no key: something to take
                ordering_key=rng.choice([None, None, "a", "b", "c"]) if i else None,
                available_at=datetime.now(UTC)
                + timedelta(hours=rng.choice([0, 0, 0, 1]) if i else 0),
            )
        conn.execute(
            "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'x',"
            " lease_until = now() + interval '1 minute' WHERE id %% %s = 0",
            (rng.randint(2, 6),),
        )
    store = Store(database_url, DispatcherConfig())
    limit = rng.randint(1, 20)
    lone, lone_params = store.claim_statement("o", limit, capped=False, alone=HERE, lone=True)
    fair, fair_params = store.claim_statement("o", limit, capped=False, alone=HERE)
    taken = _taken(database_url, lone, lone_params)
    assert taken == _taken(database_url, fair, fair_params)
    assert taken  # the first message at least


@pytest.mark.parametrize("seed", range(8))
def test_both_claim_forms_take_the_same_rows_where_no_destination_has_a_policy(
    database_url: str, seed: int
) -> None:
    # The claim with the slots ("claim") and the one without ("claim_uncapped")
    # share their turns across destinations: with no policy anywhere, each takes
    # what the other would, whatever the backlog (destinations of every size,
    # ordering keys held back by a running message, messages due later, requests
    # in flight here) and however much is asked for.
    rng = random.Random(seed)
    hosts = [f"https://d{i}.example" for i in range(rng.randint(2, 6))]
    with psycopg.connect(database_url) as conn:
        box = Outbox()
        for i in range(rng.randint(10, 60)):
            box.enqueue(
                conn,
                url=f"{rng.choice(hosts)}/hook",
                idempotency_key=f"m{i}",
                json={"i": i},
                ordering_key=rng.choice([None, None, "a", "b"]) if i else None,
                available_at=datetime.now(UTC)
                + timedelta(hours=rng.choice([0, 0, 0, 1]) if i else 0),
            )
        conn.execute(
            "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'x',"
            " lease_until = now() + interval '1 minute' WHERE id %% %s = 0",
            (rng.randint(3, 7),),
        )
    store = Store(database_url, DispatcherConfig(destination_concurrency=rng.randint(1, 4)))
    busy = {f"{host}:443": rng.randint(0, 2) for host in rng.sample(hosts, 2)}
    limit = rng.randint(1, 25)
    uncapped, uncapped_params = store.claim_statement("o", limit, capped=False, busy=busy)
    capped, capped_params = store.claim_statement("o", limit, capped=True, busy=busy)
    taken = _taken(database_url, uncapped, uncapped_params)
    assert sorted(taken) == sorted(_taken(database_url, capped, capped_params))
    assert taken  # the first message at least


# -- plans -----------------------------------------------------------------------


@pytest.mark.parametrize("capped", [False, True])
@pytest.mark.parametrize("destinations", [1, 100])
def test_the_fair_claim_walks_the_destination_index_and_the_primary_key(
    database_url: str, destinations: int, capped: bool
) -> None:
    # one destination with a backlog, or many: the claim lists the destinations
    # and takes their first messages from the destination index, whatever the sizes;
    # told of a destination alone, it checks that on the same index. So does the
    # generic plan, which knows no parameter (a prepared statement's, after a few
    # runs).
    backlog(database_url, running=False, destinations=destinations)
    store = Store(database_url, DispatcherConfig())
    statement, params = store.claim_statement(
        "o", 100, capped=capped, busy={"https://d0.example:443": 3}, alone="https://d0.example:443"
    )
    text = plan(database_url, statement.text, params)
    assert "Recursive Union" in text, text
    assert "messages_claimable_idx" in text, text
    assert "messages_pkey" in text, text
    assert "Seq Scan on messages" not in text, text
    generic = explain(database_url, statement, params, prepared=True, store=store)
    assert seq_scans(generic, "messages") == [], generic


@pytest.mark.parametrize("lean", [True, False])
def test_completion_finds_its_rows_by_primary_key(database_url: str, lean: bool) -> None:
    backlog(database_url, running=True)
    store = Store(database_url, DispatcherConfig())
    now = datetime.now(UTC)
    batch = [
        Completion(
            id=i,
            attempt=1,
            state="delivered" if lean else "ready",
            outcome="delivered" if lean else "retry",
            sent=True,
            status=200,
            started_at=now,
            duration_ms=3,
        )
        for i in range(1, 101)
    ]
    statement, params = store.complete_statement("owner-1", batch)
    assert statement.name == ("complete_delivered" if lean else "complete")
    text = plan(database_url, statement.text, params)
    assert "messages_pkey" in text, text
    assert "messages_lease_idx" not in text, text
    assert "Seq Scan on messages" not in text, text
