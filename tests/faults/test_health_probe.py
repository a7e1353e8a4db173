"""``/healthz`` follows the database: unhealthy while it cannot be reached, healthy
again once it can, while ``/livez`` stays up throughout.

The dispatcher reaches the test's database through :class:`TcpProxy`; taking the
database down means cutting every connection and refusing new ones, so nothing
the dispatcher sends gets an answer until the proxy lets connections through again.
"""

from __future__ import annotations

import asyncio

import httpx

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from tests.dispatching import fast_config, wait_until
from tests.faults.tcp_proxy import TcpProxy, proxy_target, through

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
