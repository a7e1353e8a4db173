"""Destination concurrency slots at the Store level against real PostgreSQL: the
rescue frees a slot whose holder is no longer running, whatever left it held, and
passes an expired holder's slot to a request in flight that holds none; no claim
takes a free slot while such a request waits for one."""

from __future__ import annotations

import psycopg

from dispatchers.store.postgres import Store
from outbox import Outbox
from outbox.destinations import Destinations
from tests.dispatching import delivered, fast_config
from tests.processes import scalar

ORIGIN = "https://capped.example"


async def test_a_rescue_frees_a_slot_whose_holder_no_longer_runs(database_url: str) -> None:
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        Destinations().set(conn, ORIGIN, max_concurrency=1)
        first, second = (
            box.enqueue(conn, url=f"{ORIGIN}/x", idempotency_key=f"k{i}", json={}) for i in range(2)
        )
    store = Store(database_url, fast_config(destination_concurrency=100))
    await store.open()
    try:
        assert [job.id for job in (await store.claim("owner", 10)).messages] == [first]
        # the holder stops running without its slot being freed (written here by
        # hand: an operator's change, or a completion that missed a slot moved by a
        # cap change meanwhile)
        with psycopg.connect(database_url) as conn:
            conn.execute(
                "UPDATE outbox.messages SET state = 'dead', lease_owner = NULL,"
                " lease_until = NULL, completed_at = now() WHERE id = %s",
                (first,),
            )
        assert (await store.claim("owner", 10)).messages == []  # the slot is still held
        assert await store.rescue() == []  # no lease expired...
        # ...but the stray slot is free again
        assert [job.id for job in (await store.claim("owner", 10)).messages] == [second]
    finally:
        await store.close()


async def test_a_rescue_passes_an_expired_holders_slot_to_a_request_without_one(
    database_url: str,
) -> None:
    """A lowered cap leaves a request in flight without a slot (listed); when the
    slot holder's lease expires, the rescue passes its slot to the listed request
    rather than freeing it; when that one's lease expires too, the slot is free
    and the list empty."""
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        Destinations().set(conn, ORIGIN, max_concurrency=2)
        ids = [
            box.enqueue(conn, url=f"{ORIGIN}/x", idempotency_key=f"e{i}", json={}) for i in range(3)
        ]
    store = Store(database_url, fast_config(destination_concurrency=100))
    await store.open()

    def expire(message_id: int) -> None:
        with psycopg.connect(database_url) as conn:
            conn.execute(
                "UPDATE outbox.messages SET lease_until = now() - interval '1 second'"
                " WHERE id = %s",
                (message_id,),
            )

    def seats() -> tuple[list[tuple[int, int | None]], list[int]]:
        with psycopg.connect(database_url) as conn:
            slots = conn.execute(
                "SELECT slot, message_id FROM outbox.destination_slots ORDER BY slot"
            ).fetchall()
            listed = conn.execute(
                "SELECT message_id FROM outbox.unseated_requests ORDER BY message_id"
            ).fetchall()
        return [(s, m) for s, m in slots], [m for (m,) in listed]

    try:
        assert [job.id for job in (await store.claim("owner", 10)).messages] == ids[:2]
        with psycopg.connect(database_url) as conn:
            Destinations().set(conn, ORIGIN, max_concurrency=1)
        assert seats() == ([(1, ids[0])], [ids[1]])
        expire(ids[0])
        assert await store.rescue() == [(ids[0], "ready")]
        assert seats() == ([(1, ids[1])], [])  # passed on, not freed
        assert (await store.claim("owner", 10)).messages == []  # one in flight: at the cap
        expire(ids[1])
        assert sorted(await store.rescue()) == [(ids[1], "ready")]
        assert seats() == ([(1, None)], [])
        assert len((await store.claim("owner", 10)).messages) == 1
    finally:
        await store.close()


async def test_a_slot_freed_beside_the_cap_change_that_lists_a_request_is_not_taken(
    database_url: str,
) -> None:
    """A cap lowered while a completion runs: the cap change lists the requests
    above the new cap, and the completion, which cannot see that list yet, frees
    its slot to nobody. No claim takes that slot while a request waits for one."""
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        Destinations().set(conn, ORIGIN, max_concurrency=3)
        for i in range(5):
            box.enqueue(conn, url=f"{ORIGIN}/x", idempotency_key=f"r{i}", json={})
    store = Store(database_url, fast_config(destination_concurrency=100))
    await store.open()
    try:
        first, *others = (await store.claim("owner", 3)).messages
        assert len(others) == 2
        with psycopg.connect(database_url) as operator:  # one transaction, open
            Destinations().set(operator, ORIGIN, max_concurrency=1)
            # the completion of the request in the slot the cap keeps, meanwhile
            done = delivered(first.id, first.attempts)
            assert (await store.complete("owner", [done]))[0] == {first.id}
        # both committed: two requests in flight, listed, and the kept slot free
        assert scalar(database_url, "SELECT count(*) FROM outbox.unseated_requests") == 2
        assert (await store.claim("owner", 10)).messages == []  # 2 in flight against a cap of 1
        for job in others:
            assert (await store.complete("owner", [delivered(job.id, job.attempts)]))[0] == {job.id}
        assert scalar(database_url, "SELECT count(*) FROM outbox.unseated_requests") == 0
        assert len((await store.claim("owner", 10)).messages) == 1  # none waits: the slot is taken
    finally:
        await store.close()
