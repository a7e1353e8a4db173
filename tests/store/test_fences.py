"""The fences of the dispatcher's writes, each alone, at the Store level against
real PostgreSQL: an outcome or a heartbeat is applied only by the owner of the
lease *and* for its current attempt, whichever statement writes it (``complete``
for a batch with any outcome but a sent success, ``complete_delivered`` for one
of sent successes only, ``renew``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatchers.store.messages import Completion
from dispatchers.store.postgres import Store
from tests.database import Db
from tests.dispatching import delivered, fast_config, retried
from tests.dispatching import failed as dead


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


def state(db: Db, mid: int) -> list[tuple[object, ...]]:
    return db.query("SELECT state, lease_owner, attempts FROM outbox.messages WHERE id = %s", mid)


def history(db: Db) -> list[tuple[object, ...]]:
    return db.query("SELECT id, attempts FROM outbox.delivered ORDER BY id")


async def test_another_owner_at_the_same_attempt_number_is_fenced_out_by_owner(
    db: Db, store: Store
) -> None:
    taken = db.enqueue("taken", "https://example.com/x")
    mine = db.enqueue("mine", "https://example.com/y")
    assert {j.id: j.attempts for j in (await store.claim("owner-a", 2)).messages} == {
        taken: 1,
        mine: 1,
    }
    # owner-a gives `taken` back unsent (its attempt refunded); owner-b claims it,
    # at the same attempt number owner-a had
    released = Completion(taken, 1, "ready", "released", sent=False)
    assert (await store.complete("owner-a", [released]))[0] == {taken}
    (job,) = (await store.claim("owner-b", 1)).messages
    assert (job.id, job.attempts) == (taken, 1)
    # owner-a's stale outcomes for attempt 1 (a write retried after its answer
    # was lost) match the attempt but not the owner: none applies
    assert await store.complete("owner-a", [delivered(taken, 1)]) == (set(), {})  # delivered
    assert state(db, taken) == [("running", "owner-b", 1)]
    mixed = [delivered(taken, 1), retried(mine, 1)]
    assert (await store.complete("owner-a", mixed))[0] == {mine}  # complete, "done"
    assert state(db, taken) == [("running", "owner-b", 1)]
    assert await store.complete("owner-a", [dead(taken, 1)]) == (set(), {})  # "updated"
    assert state(db, taken) == [("running", "owner-b", 1)]
    assert history(db) == []
    assert db.query("SELECT message_id, attempt, outcome FROM outbox.attempts") == [
        (mine, 1, "retry")
    ]
    assert await store.renew("owner-a", [(taken, 1)]) == set()
    assert await store.renew("owner-b", [(taken, 1)]) == {taken}
    # the owner's own outcome applies
    assert (await store.complete("owner-b", [delivered(taken, 1)]))[0] == {taken}
    assert history(db) == [(taken, 1)]


async def test_an_earlier_attempt_of_the_same_owner_is_fenced_out_by_attempt(
    db: Db, store: Store
) -> None:
    again = db.enqueue("again", "https://example.com/x")
    mine = db.enqueue("mine", "https://example.com/y")
    assert {j.id for j in (await store.claim("owner-a", 2)).messages} == {again, mine}
    # `again`'s lease expires, the rescuer returns it, the same owner claims it:
    # attempt 2 under the same owner name
    db.expire(again)
    assert await store.rescue() == [(again, "ready")]
    (job,) = (await store.claim("owner-a", 1)).messages
    assert (job.id, job.attempts) == (again, 2)
    assert await store.complete("owner-a", [delivered(again, 1)]) == (set(), {})
    assert state(db, again) == [("running", "owner-a", 2)]
    mixed = [delivered(again, 1), retried(mine, 1)]
    assert (await store.complete("owner-a", mixed))[0] == {mine}
    assert state(db, again) == [("running", "owner-a", 2)]
    assert await store.complete("owner-a", [dead(again, 1)]) == (set(), {})
    assert state(db, again) == [("running", "owner-a", 2)]
    assert history(db) == []
    assert await store.renew("owner-a", [(again, 1)]) == set()
    assert await store.renew("owner-a", [(again, 2)]) == {again}
    assert (await store.complete("owner-a", [delivered(again, 2)]))[0] == {again}
    assert history(db) == [(again, 2)]
