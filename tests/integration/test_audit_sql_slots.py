"""Destination concurrency slots at the Store level against real PostgreSQL: the
rescue frees a slot whose holder is no longer running, whatever left it held."""

from __future__ import annotations

import psycopg

from dispatchers.db import Store
from outbox import Outbox
from outbox.destinations import Destinations
from tests.dispatching import fast_config

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
        assert [job.id for job in await store.claim("owner", 10)] == [first]
        # the holder stops running without its slot being freed (written here by
        # hand: an operator's change, or a completion that missed a slot moved by a
        # cap change meanwhile)
        with psycopg.connect(database_url) as conn:
            conn.execute(
                "UPDATE outbox.messages SET state = 'dead', lease_owner = NULL,"
                " lease_until = NULL, completed_at = now() WHERE id = %s",
                (first,),
            )
        assert await store.claim("owner", 10) == []  # the slot is still held
        assert await store.rescue() == []  # no lease expired...
        # ...but the stray slot is free again
        assert [job.id for job in await store.claim("owner", 10)] == [second]
    finally:
        await store.close()
