"""The dispatcher's statements, prepared on each server connection as needed.

A pooler may move a dispatcher to a server connection where a statement was never
prepared, or where a peer prepared it already; both must cost a retry, never an
error, and with prepared statements off nothing is prepared at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from dispatchers.runtime.config import DispatcherConfig
from dispatchers.store.postgres import Store
from dispatchers.store.statements import store_queries
from outbox import Outbox

URL = "https://example.com/hook"


def enqueue(url: str, *keys: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [Outbox().enqueue(conn, url=URL, idempotency_key=k, json={}) for k in keys]


async def prepared_here(conn: psycopg.AsyncConnection[Any]) -> set[str]:
    cur = await conn.execute("SELECT name FROM pg_prepared_statements")
    return {row[0] for row in await cur.fetchall()}


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    # one pooled connection, so each call below runs on the same one
    store = Store(database_url, DispatcherConfig())
    await store.open()
    await store.pool.resize(min_size=1, max_size=1)
    try:
        yield store
    finally:
        await store.close()


async def test_a_statement_is_prepared_once_per_connection(database_url: str, store: Store) -> None:
    enqueue(database_url, "a", "b", "c")
    for _ in range(3):
        assert len((await store.claim("owner-p", 1)).messages) == 1
    assert store.round_trips == 3  # the PREPARE went with the first execution
    name = store_queries("outbox")["claim_uncapped"].prepared.name
    async with store.pool.connection() as conn:
        assert name in await prepared_here(conn)


async def test_a_statement_missing_on_the_connection_is_prepared_again(
    database_url: str, store: Store
) -> None:
    # as if a pooler had moved the dispatcher to another server connection
    enqueue(database_url, "a", "b")
    assert len((await store.claim("owner-p", 1)).messages) == 1
    async with store.pool.connection() as conn:
        await conn.execute("DEALLOCATE ALL")
    assert len((await store.claim("owner-p", 1)).messages) == 1
    assert store.round_trips == 3  # one refused EXECUTE, then PREPARE + EXECUTE


async def test_a_statement_a_peer_prepared_already_is_used(database_url: str, store: Store) -> None:
    # as if another client of the pooler had prepared it on this server connection
    enqueue(database_url, "a")
    prepared = store_queries("outbox")["renew"].prepared
    async with store.pool.connection() as conn:
        await conn.execute(prepared.prepare.replace("%%", "%"))
    assert await store.renew("owner-p", []) == set()
    assert store.round_trips == 2  # PREPARE refused as a duplicate, then EXECUTE


async def test_nothing_is_prepared_when_prepared_statements_are_off(database_url: str) -> None:
    enqueue(database_url, "a")
    store = Store(database_url, DispatcherConfig(prepared_statements=False))
    await store.open()
    await store.pool.resize(min_size=1, max_size=1)
    try:
        assert len((await store.claim("owner-p", 5)).messages) == 1
        async with store.pool.connection() as conn:
            assert await prepared_here(conn) == set()
    finally:
        await store.close()


async def test_the_occasional_statements_are_planned_for_their_values(store: Store) -> None:
    # A generic plan of the retention batch joined whole tables; these stay unprepared.
    assert await store.remove_history(100) == (0,)
    assert await store.rescue() == []
    assert await store.work_remaining() == (0, 0, 0)
    async with store.pool.connection() as conn:
        assert await prepared_here(conn) == set()
