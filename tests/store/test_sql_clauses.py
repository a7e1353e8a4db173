"""What the SQL of the dispatcher must do, each pinned down by a test that fails
when the clause doing it is taken out or changed (``python -m
tests.mutation.sql_mutants`` changes each clause in a copy and runs these):
the state fence of every completion, renewal and rescue, alone; the breaker's
statements; the ordering predicate's paused messages; the slots kept in step
with a policy and passed on as requests end."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest

from dispatchers.store.postgres import Store
from outbox import Outbox
from outbox.destinations import Destinations
from outbox.endpoints import Endpoints
from tests.database import Db
from tests.dispatching import delivered, fast_config, retried
from tests.dispatching import failed as dead

URL = "https://example.com/x"


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


@pytest.fixture
async def store(db: Db) -> AsyncIterator[Store]:
    store = Store(db.url, fast_config())
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def lease(db: Db, mid: int) -> list[tuple[object, ...]]:
    return db.query("SELECT state, lease_owner, attempts FROM outbox.messages WHERE id = %s", mid)


# -- the state fence, alone ---------------------------------------------------------


async def test_a_message_no_longer_running_is_neither_completed_nor_renewed_by_its_lease(
    db: Db, store: Store
) -> None:
    """The table lets a row that is not running keep a lease owner (only a lease
    end with it is refused): the fence of owner and attempt alone would let a
    stale completion or heartbeat write to it; the state stops them."""
    stopped = db.enqueue("stopped", URL)
    other = db.enqueue("other", "https://example.com/y")
    assert {j.id: j.attempts for j in (await store.claim("owner-a", 2)).messages} == {
        stopped: 1,
        other: 1,
    }
    db.query(
        "UPDATE outbox.messages SET state = 'paused', lease_until = NULL WHERE id = %s"
        " RETURNING id",
        stopped,
    )
    assert await store.complete("owner-a", [delivered(stopped, 1)]) == (set(), {})  # lean
    mixed = [delivered(stopped, 1), retried(other, 1)]
    assert (await store.complete("owner-a", mixed))[0] == {other}  # complete, "done"
    assert await store.complete("owner-a", [dead(stopped, 1)]) == (set(), {})  # "updated"
    assert await store.renew("owner-a", [(stopped, 1)]) == set()
    assert lease(db, stopped) == [("paused", "owner-a", 1)]
    assert db.query("SELECT id FROM outbox.delivered") == []
    assert db.query("SELECT message_id FROM outbox.attempts") == [(other,)]


async def test_the_rescuer_takes_only_running_messages_whatever_their_lease_end_says(
    db: Db, store: Store
) -> None:
    stopped = db.enqueue("stopped", URL)
    (job,) = (await store.claim("owner-a", 1)).messages
    db.query(
        "UPDATE outbox.messages SET state = 'paused', lease_owner = NULL,"
        " lease_until = now() - interval '1 second' WHERE id = %s RETURNING id",
        stopped,
    )
    assert await store.rescue() == []
    assert lease(db, stopped) == [("paused", None, job.attempts)]


# -- the breaker's statements ------------------------------------------------------

DESTINATION = "https://down.example:443"


def health(db: Db) -> list[tuple[object, ...]]:
    """The destination's row: state, probe owner, failed probes, and seconds blocked
    from now (to the nearest ten)."""
    return [
        (state, owner, failed, round(float(seconds) / 10) * 10)
        for state, owner, failed, seconds in db.query(
            "SELECT state, probe_owner, failed_probes, extract(epoch FROM blocked_until - now())"
            " FROM outbox.destination_health WHERE destination = %s",
            DESTINATION,
        )
    ]


def set_health(db: Db, state: str, blocked_s: float, owner: str | None = None) -> None:
    db.query(
        "INSERT INTO outbox.destination_health"
        " (destination, state, blocked_until, opened_at, probe_owner, failed_probes)"
        " VALUES (%s, %s, now() + make_interval(secs => %s),"
        "         CASE WHEN %s <> 'held' THEN now() END, %s, %s) RETURNING 1",
        DESTINATION,
        state,
        blocked_s,
        state,
        owner,
        0 if state == "held" else 3,
    )


async def test_a_probe_is_closed_only_by_the_owner_it_was_taken_by(db: Db, store: Store) -> None:
    set_health(db, "probing", 60.0, owner="other")
    assert await store.health("health_close", destination=DESTINATION, owner="me") is None
    assert health(db) == [("probing", "other", 3, 60)]
    closed = await store.health("health_close", destination=DESTINATION, owner="other")
    assert closed is not None and closed.state == "probing"
    assert health(db) == []


@pytest.mark.parametrize("state", ["open", "probing"])
async def test_opening_a_breaker_open_or_probing_already_changes_nothing(
    db: Db, store: Store, state: str
) -> None:
    """Another dispatcher opened it first: its back-off and its count of failed
    probes stand."""
    set_health(db, state, 60.0, owner="other" if state == "probing" else None)
    opened = await store.health(
        "health_open", destination=DESTINATION, backoff_s=10.0, reason="failing"
    )
    assert opened is None
    assert health(db) == [(state, "other" if state == "probing" else None, 3, 60)]


async def test_opening_a_held_destination_keeps_a_hold_longer_than_the_back_off(
    db: Db, store: Store
) -> None:
    set_health(db, "held", 600.0)
    opened = await store.health(
        "health_open", destination=DESTINATION, backoff_s=10.0, reason="failing"
    )
    assert opened is not None and opened.state == "open"
    assert health(db) == [("open", None, 0, 600)]


async def test_a_hold_only_ever_lengthens_what_blocks_a_destination(db: Db, store: Store) -> None:
    set_health(db, "held", 600.0)
    shorter = await store.health(
        "health_hold", destination=DESTINATION, hold_s=30.0, reason="HTTP 429"
    )
    assert shorter is None
    assert health(db) == [("held", None, 0, 600)]
    longer = await store.health(
        "health_hold", destination=DESTINATION, hold_s=1200.0, reason="HTTP 429"
    )
    assert longer is not None
    assert health(db) == [("held", None, 0, 1200)]


@pytest.mark.parametrize("state", ["held", "open"])
async def test_only_a_probing_breaker_has_a_probe_owner(db: Db, state: str) -> None:
    """Why health_close and health_reopen need no fence of their state beside
    the probe's owner: the table refuses an owner on any other state."""
    with pytest.raises(psycopg.errors.CheckViolation):
        set_health(db, state, 60.0, owner="me")


# -- ordering keys -------------------------------------------------------------------


async def test_a_paused_message_holds_back_the_later_messages_of_its_key(
    db: Db, store: Store
) -> None:
    box = Outbox()
    with psycopg.connect(db.url) as conn:
        endpoint = Endpoints().add(conn, url="https://paused.example/hook")
        box.publish(conn, "order.paid", {"n": 1}, ordering_key="acct-1")
    later = db.enqueue("later", "https://other.example/x", ordering_key="acct-1")
    with psycopg.connect(db.url) as conn:
        Endpoints().disable(conn, endpoint.id)
    assert db.query("SELECT state FROM outbox.messages WHERE id <> %s", later) == [("paused",)]
    assert (await store.claim("me", 10)).messages == []


# -- slots kept in step with a policy, and passed on ----------------------------------

ORIGIN = "https://capped.example"


def scalar(db: Db, sql: str, *params: object) -> object:
    ((value,),) = db.query(sql, *params)
    return value


def enqueue_many(db: Db, count: int) -> list[int]:
    return [db.enqueue(f"k{i}", f"{ORIGIN}/x") for i in range(count)]


async def test_a_slot_that_frees_passes_to_a_waiting_request_that_still_runs(
    db: Db, store: Store
) -> None:
    """Of the requests waiting for a slot, one that ends in the same batch as the
    holder must not inherit its slot (it would hold it after it ended, and the
    destination would start nothing more): the slot passes to one still in
    flight, though it came later in the list's order."""
    first, second, third = enqueue_many(db, 3)
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, max_concurrency=3)
    assert sorted(j.id for j in (await store.claim("owner", 3)).messages) == [first, second, third]
    for cap in (2, 1):  # the holders of slots 3 and 2 are listed, in that order
        with psycopg.connect(db.url) as conn:
            Destinations().set(conn, ORIGIN, max_concurrency=cap)
    assert db.query("SELECT message_id FROM outbox.destination_slots") == [(first,)]
    assert {r[0] for r in db.query("SELECT message_id FROM outbox.unseated_requests")} == {
        second,
        third,
    }
    done = [delivered(first, 1), delivered(second, 1)]
    assert (await store.complete("owner", done))[0] == {first, second}
    assert db.query("SELECT message_id FROM outbox.destination_slots") == [(third,)]
    assert db.query("SELECT message_id FROM outbox.unseated_requests") == []


async def test_removing_a_cap_leaves_no_request_waiting_for_a_slot(db: Db, store: Store) -> None:
    enqueue_many(db, 3)
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, max_concurrency=3)
    assert len((await store.claim("owner", 3)).messages) == 3
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, max_concurrency=1)
    assert scalar(db, "SELECT count(*) FROM outbox.unseated_requests") == 2
    with psycopg.connect(db.url) as conn:
        Destinations().delete(conn, ORIGIN)
    assert scalar(db, "SELECT count(*) FROM outbox.unseated_requests") == 0
    assert scalar(db, "SELECT count(*) FROM outbox.destination_slots") == 0


async def test_lowering_a_burst_removes_the_rate_slots_above_it(db: Db, store: Store) -> None:
    enqueue_many(db, 5)
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, rate_limit=0.01, burst=4)
        Destinations().set(conn, ORIGIN, rate_limit=0.01, burst=2)
    assert scalar(db, "SELECT count(*) FROM outbox.rate_slots") == 2
    assert len((await store.claim("owner", 5)).messages) == 2  # a burst of two


async def test_a_rate_changed_takes_its_new_period_and_grants_no_fresh_burst(
    db: Db, store: Store
) -> None:
    enqueue_many(db, 3)
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, rate_limit=0.1, burst=1)
    assert len((await store.claim("owner", 3)).messages) == 1  # the slot is taken for 10 s
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, rate_limit=0.01, burst=1)  # one every 100 s
    assert scalar(db, "SELECT extract(epoch FROM period) FROM outbox.rate_slots") == 100
    assert (await store.claim("owner", 3)).messages == []  # the taken slot is still taken


async def test_the_rescuer_drops_a_waiting_request_that_no_longer_runs(
    db: Db, store: Store
) -> None:
    """A request listed as waiting for a slot that stops running by another way
    than a completion (here an operator's UPDATE) leaves the list at the next
    rescue, so that no slot is ever passed to it."""
    enqueue_many(db, 4)
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, max_concurrency=2)
    flying = {j.id: j for j in (await store.claim("owner", 2)).messages}
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, max_concurrency=1)
    ((listed,),) = db.query("SELECT message_id FROM outbox.unseated_requests")
    db.query(
        "UPDATE outbox.messages SET state = 'dead', lease_owner = NULL, lease_until = NULL,"
        " completed_at = now() WHERE id = %s RETURNING id",
        listed,
    )
    assert await store.rescue() == []  # no lease expired...
    assert scalar(db, "SELECT count(*) FROM outbox.unseated_requests") == 0  # ...but it left
    (holder,) = (j for i, j in flying.items() if i != listed)
    assert (await store.complete("owner", [delivered(holder.id, holder.attempts)]))[0] == {
        holder.id
    }
    assert len((await store.claim("owner", 2)).messages) == 1  # its slot was freed, not passed on


async def test_each_request_of_a_burst_takes_a_rate_slot_of_its_own(db: Db, store: Store) -> None:
    enqueue_many(db, 4)
    with psycopg.connect(db.url) as conn:
        Destinations().set(conn, ORIGIN, rate_limit=0.01, burst=2)
    taken = [len((await store.claim("owner", 1)).messages) for _ in range(3)]
    assert taken == [1, 1, 0]  # two slots, each taken once: the burst is spent
    assert scalar(db, "SELECT count(*) FROM outbox.rate_slots WHERE next_at <= now()") == 0
