"""THE NAIVE BASELINE: a one-row-at-a-time dispatcher, kept only for comparison.

``outbox bench --baseline naive`` runs it interleaved with the real dispatcher,
so the table shows what batching buys: 32 workers, each claiming ONE message,
POSTing it and recording ONE outcome matched by id alone. Never use it to
deliver anything: it has no fencing, heartbeat, rescue, retry policy or SSRF
guard. Its statements are the ``naive_*`` ones in ``queries.sql``.

Design: docs/explanation/design/bench-baselines.md
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import psycopg_pool

from dispatchers.bench.env import bench_queries
from dispatchers.delivery.http import idempotency_header

WORKERS = 32
POOL_SIZE = 4  # psycopg_pool's default size; 16 and 32 were slower here
REQUEST_TIMEOUT = 10.0


@dataclass
class NaiveStats:
    """What one naive drain did."""

    delivered: int = 0
    retried: int = 0
    round_trips: int = 0
    claims: int = 0


async def run_naive(
    url: str,
    schema: str,
    *,
    workers: int = WORKERS,
    pool_size: int = POOL_SIZE,
    transport: httpx.AsyncBaseTransport | None = None,
    http: bool = True,
    stats: NaiveStats | None = None,
) -> NaiveStats:
    """Drain every due message of ``schema`` the naive way; return the counts.

    :param transport: an httpx transport for the shared client; by default the
        client's own, sending to the messages' URLs.
    :param http: False to send nothing and count every message as answered 200,
        to time the queue alone (as drain-noop does for ours).
    :param stats: counters to update as it goes (so a caller that cancels the
        drain still knows how far it got).
    """
    queries = bench_queries(schema)
    owner = f"naive:{os.getpid()}"
    stats = stats if stats is not None else NaiveStats()
    pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]] = (
        psycopg_pool.AsyncConnectionPool(
            url,
            min_size=pool_size,
            max_size=pool_size,
            kwargs={"autocommit": True},  # each statement is its own transaction
            open=False,
            timeout=30.0,
            name="outbox-bench-naive",
        )
    )
    client = httpx.AsyncClient(
        transport=transport,
        timeout=REQUEST_TIMEOUT,
        trust_env=False,
        # one connection per worker kept alive: the default keeps only 20, and
        # churning connections would handicap the baseline
        limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers),
    )

    async def worker() -> None:
        while True:
            async with pool.connection() as conn:
                stats.round_trips += 1
                stats.claims += 1
                cur = await conn.execute(queries["naive_claim"], {"owner": owner})
                row = await cur.fetchone()
            if row is None:
                return
            # the attempt number (last column) is never looked at: that is the flaw
            message_id, key, target, method, body, content_type, _ = row
            started_at = datetime.now(UTC)
            start = time.monotonic()
            status: int | None = None
            error: str | None = None
            if not http:
                status = 200
            else:
                try:
                    response = await client.request(
                        method,
                        target,
                        content=body,
                        headers={
                            "Content-Type": content_type,
                            "Idempotency-Key": idempotency_header(key, "structured"),
                        },
                    )
                    status = response.status_code
                except httpx.HTTPError as exc:
                    error = type(exc).__name__
            duration_ms = int((time.monotonic() - start) * 1000)
            async with pool.connection() as conn:
                stats.round_trips += 1
                if status is not None and 200 <= status < 300:
                    await conn.execute(
                        queries["naive_complete"],
                        {
                            "id": message_id,
                            "owner": owner,
                            "status": status,
                            "started_at": started_at,
                            "duration_ms": duration_ms,
                        },
                    )
                    stats.delivered += 1
                else:
                    await conn.execute(
                        queries["naive_retry"],
                        {"id": message_id, "status": status, "error": error or f"HTTP {status}"},
                    )
                    stats.retried += 1

    try:
        await pool.open(wait=True, timeout=30.0)
        await asyncio.gather(*(worker() for _ in range(workers)))
    finally:
        await client.aclose()
        await pool.close()
    return stats
