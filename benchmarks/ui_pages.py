"""How long the dashboard's pages take on big tables.

Fills a freshly migrated schema with a hot table of ``--hot`` messages (ready,
running, dead) and a history of ``--history`` delivered messages with one attempt
each, spread over the last day, then serves ``outbox ui`` in-process and times
each page over HTTP on 127.0.0.1 (median and slowest of ``--repeat``):

    python benchmarks/ui_pages.py --database-url postgresql:///scratch
    python benchmarks/ui_pages.py --database-url URL --hot 100000 --history 1000000

The database must be a scratch one: its ``outbox`` schema is dropped first.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import time
from datetime import UTC, datetime, timedelta

import aiohttp
import psycopg

from dispatchers.runtime.log import EventLog
from dispatchers.ui.app import serve
from dispatchers.ui.auth import Guard
from dispatchers.ui.dashboard import Dashboard, templates
from dispatchers.ui.store import DashboardStore
from outbox.migrations import migrate

FILL = """
INSERT INTO outbox.endpoints (url, event_types)
SELECT 'https://example.com/hook/' || i, ARRAY['order.created']
FROM generate_series(1, 20) AS i;

INSERT INTO outbox.messages (id, idempotency_key, target, destination, endpoint_id, body,
                             content_type, event_type, state, attempts, max_attempts,
                             lease_owner, lease_until, completed_at, last_error)
SELECT i, 'hot-' || i, 'endpoint:' || (1 + i % 20), 'endpoint:' || (1 + i % 20), 1 + i % 20,
       '{}', 'application/json',
       'order.created',
       CASE WHEN i % 20 = 0 THEN 'dead' WHEN i % 50 = 1 THEN 'running' ELSE 'ready' END,
       CASE WHEN i % 20 = 0 THEN 8 ELSE 0 END, 8,
       CASE WHEN i % 50 = 1 THEN 'host:' || (i % 4) || ':x' END,
       CASE WHEN i % 50 = 1 THEN now() + interval '30 seconds' END,
       CASE WHEN i % 20 = 0 THEN now() - (i % 1440) * interval '1 minute' END,
       CASE WHEN i % 20 = 0 THEN 'HTTP 500' END
FROM generate_series(1, %(hot)s) AS i;

INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, method, headers, body,
                              content_type, event_type, attempts, max_attempts, last_status,
                              created_at, completed_at)
SELECT %(hot)s + i, 'old-' || i, 'endpoint:' || (1 + i % 20), 1 + i % 20, 'POST', '{}', '{}',
       'application/json', 'order.created', 1, 8, 200,
       now() - (i % 86400) * interval '1 second', now() - (i % 86400) * interval '1 second'
FROM generate_series(1, %(history)s) AS i;

INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, duration_ms, status,
                             outcome)
SELECT %(hot)s + i, 1, 'host:' || (i % 4) || ':x', now() - (i % 86400) * interval '1 second',
       20, CASE WHEN i % 10 = 0 THEN 500 ELSE 200 END,
       CASE WHEN i % 10 = 0 THEN 'retry' ELSE 'delivered' END
FROM generate_series(1, %(history)s) AS i;

SELECT setval('outbox.messages_id_seq', %(hot)s + %(history)s);
ANALYZE outbox.messages, outbox.delivered, outbox.attempts, outbox.endpoints;
"""

PAGES = [
    "/",
    "/messages",
    "/messages?state=dead",
    "/messages?key=hot-4242",
    "/messages?key=old-424242",
    "/messages?event_type=order.created&endpoint=7",
    "/messages/4242",
    "/dead",
    "/dead?endpoint=7&since=24h",
    "/dead/confirm?action=retry&endpoint=7",
    "/endpoints",
    "/endpoints/7",
    "/messages?webhook_id=old-424246:7",
    "/messages?from=2020-01-01T00:00&until=2020-01-02T00:00",
]


def time_ranges(now: datetime) -> list[str]:
    """Searches by creation time over the filled day: an hour in its middle, an
    hour at its start, and everything but the last hour."""

    def moment(hours: float) -> str:
        return (now - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M")

    return [
        f"/messages?from={moment(12)}&until={moment(11)}",
        f"/messages?from={moment(24)}&until={moment(23)}",
        f"/messages?from={moment(24 * 7)}&until={moment(1)}",
    ]


def fill(url: str, hot: int, history: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS outbox CASCADE")
    migrate(url)
    with psycopg.connect(url) as conn:
        conn.execute(FILL.replace("%(hot)s", str(hot)).replace("%(history)s", str(history)))


async def measure(url: str, repeat: int) -> None:
    dashboard = Dashboard(
        store=DashboardStore(url, schema="outbox"),
        guard=Guard(token=None),
        log=EventLog(stream=io.StringIO(), format="json"),
        templates=templates(),
        read_only=False,
        database="bench",
    )
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(dashboard, host="127.0.0.1", port=0, started=listening.set_result)
    )
    base = (await listening).rstrip("/")
    async with aiohttp.ClientSession() as http:
        for path in PAGES + time_ranges(datetime.now(UTC)):
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                async with http.get(base + path) as response:
                    await response.read()
                    if response.status != 200:
                        raise SystemExit(f"{path}: HTTP {response.status}")
                times.append((time.perf_counter() - start) * 1000)
            print(f"{path:50} median {statistics.median(times):7.1f} ms   max {max(times):7.1f} ms")
    server.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="a scratch database")
    parser.add_argument("--hot", type=int, default=100_000, help="messages in the hot table")
    parser.add_argument("--history", type=int, default=1_000_000, help="delivered messages")
    parser.add_argument("--repeat", type=int, default=10, help="requests per page")
    parser.add_argument("--no-fill", action="store_true", help="measure the data already there")
    args = parser.parse_args()
    if not args.no_fill:
        started = time.perf_counter()
        fill(args.database_url, args.hot, args.history)
        print(f"filled in {time.perf_counter() - started:.0f} s")
    asyncio.run(measure(args.database_url, args.repeat))


if __name__ == "__main__":
    main()
