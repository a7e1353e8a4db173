"""``/healthz`` follows the database: unhealthy while it cannot be reached, healthy
again once it can, while ``/livez`` stays up throughout.

The dispatcher reaches the test's database through :class:`TcpProxy`; taking the
database down means cutting every connection and refusing new ones, so nothing
the dispatcher sends gets an answer until the proxy lets connections through again.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import EventLog, NullLog
from tests.database import Db
from tests.dispatching import fast_config, wait_until
from tests.faults.tcp_proxy import TcpProxy, proxy_target, through
from tests.receiver import Receiver

DOWN_FOR = 3600.0
"""Longer than the test: the database stays down until the test brings it back."""


async def status(client: httpx.AsyncClient, url: str) -> int:
    return (await client.get(url)).status_code


async def wait_for_status(client: httpx.AsyncClient, url: str, expected: int) -> None:
    """Poll ``url`` until it answers ``expected``; fail after 60 s."""
    async with asyncio.timeout(60):
        while True:
            if await status(client, url) == expected:
                return
            await asyncio.sleep(0.1)


async def test_healthz_is_unhealthy_while_the_database_is_down_and_healthy_after(
    database_url: str,
) -> None:
    with TcpProxy(proxy_target(database_url)) as proxy:
        cfg = fast_config(metrics_port=0, db_connect_timeout=1.0)
        dispatcher = Dispatcher(through(proxy, database_url), cfg, log=NullLog())
        task = asyncio.create_task(dispatcher.run())
        try:
            await wait_until(lambda: dispatcher.metrics_server is not None)
            assert dispatcher.metrics_server is not None
            port = dispatcher.metrics_server.sockets[0].getsockname()[1]
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(timeout=10) as client:
                await wait_for_status(client, base + "/healthz", 200)

                proxy.refuse(DOWN_FOR)
                assert proxy.cut() >= 1  # the dispatcher's connections went down with it
                await wait_for_status(client, base + "/healthz", 503)
                assert await status(client, base + "/livez") == 200
                assert dispatcher.stats.db_errors >= 1  # it tried, and was refused

                proxy.refuse(0)
                await wait_for_status(client, base + "/healthz", 200)
                assert await status(client, base + "/livez") == 200
        finally:
            dispatcher.stop()
            async with asyncio.timeout(30):
                await task


OUTAGE = 8.0
"""How long the database stays down in the test below: long enough that
psycopg_pool's own reconnection back-off (1, 2, 4, 8 s...) would have left the
dispatcher without a connection for seconds after the database came back."""

UNHEALTHY_WITHIN = 8.0
"""Bound on how soon /healthz says 503 once the database is gone: the first
failed claim, well before the lease (30 s) after which the old check gave up."""

RESUMED_WITHIN = 8.0
"""Bound on how soon deliveries resume once the database is back."""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


async def test_healthz_and_deliveries_follow_the_database_within_seconds(
    database_url: str, receiver: Receiver
) -> None:
    db = Db(database_url)
    stream = io.StringIO()
    with TcpProxy(proxy_target(database_url)) as proxy:
        # the production lease and poll interval: the bounds above are well
        # inside them
        cfg = fast_config(lease=30.0, poll_interval=1.0, metrics_port=0, db_connect_timeout=1.0)
        log = EventLog(stream=stream, format="json")
        dispatcher = Dispatcher(through(proxy, database_url), cfg, log=log)
        task = asyncio.create_task(dispatcher.run())
        try:
            await wait_until(lambda: dispatcher.metrics_server is not None)
            assert dispatcher.metrics_server is not None
            port = dispatcher.metrics_server.sockets[0].getsockname()[1]
            healthz = f"http://127.0.0.1:{port}/healthz"
            async with httpx.AsyncClient(timeout=10) as client:
                db.enqueue("before", receiver.url)
                await wait_until(lambda: dispatcher.stats.delivered == 1, 30)
                assert await status(client, healthz) == 200

                proxy.refuse(DOWN_FOR)
                proxy.cut()
                down = time.monotonic()
                await within(UNHEALTHY_WITHIN, "healthz 503", lambda: healthy(client, healthz, 503))
                unhealthy_after = time.monotonic() - down
                # written straight to the database, while the dispatcher cannot see it
                db.enqueue("during", receiver.url)
                await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - down)))  # the outage
                assert await status(client, healthz) == 503  # still down, still said

                proxy.refuse(0)
                back = time.monotonic()
                await within(RESUMED_WITHIN, "delivery resumed", lambda: delivered(dispatcher, 2))
                resumed_after = time.monotonic() - back
                await within(RESUMED_WITHIN, "healthz 200", lambda: healthy(client, healthz, 200))
        finally:
            dispatcher.stop()
            async with asyncio.timeout(30):
                await task
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    reconnected = [e for e in events if e["event"] == "reconnected"]
    assert len(reconnected) == 1, reconnected
    assert reconnected[0]["unreachable_s"] >= OUTAGE - 1
    assert reconnected[0]["errors"] >= 1
    assert [r.headers["idempotency-key"] for r in receiver.requests] == ['"before"', '"during"']
    print(f"\n503 after {unhealthy_after:.1f} s; delivering again {resumed_after:.1f} s after")


async def healthy(client: httpx.AsyncClient, url: str, expected: int) -> bool:
    return await status(client, url) == expected


async def delivered(dispatcher: Dispatcher, count: int) -> bool:
    return dispatcher.stats.delivered >= count


async def within(seconds: float, what: str, condition: Callable[[], Awaitable[bool]]) -> None:
    """Return once ``condition()`` holds; fail loudly after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s")
        await asyncio.sleep(0.05)
