"""Proxy credentials that need percent-encoding in the URL (an ``@``, a ``:``, a
space, a ``%``) reach the proxy decoded, through either HTTP client.

``--proxy 'http://us%3Aer:pw@...'`` used to be accepted and then fail as the
aiohttp client started (its Basic encoding refuses a ``:`` in the user name);
that one is refused when parsed now (``tests/delivery/test_proxy.py``), and every
other percent-encoded user name and password works with both clients.
"""

from __future__ import annotations

import asyncio
import base64

import pytest

from dispatchers.delivery.proxy import Proxy
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from tests.database import Db
from tests.dispatching import fast_config
from tests.forward_proxy import ForwardProxy
from tests.receiver import Receiver

GUARDED = {"allow_private_networks": False, "allow_networks": ("127.0.0.1/32",)}
"""The guard on, the receiver's address allowed, the proxy's (127.0.0.2) not."""

USER, PASSWORD = "us@er", "p:ss w%"


@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
async def test_percent_encoded_proxy_credentials_reach_the_proxy_decoded(
    database_url: str, receiver: Receiver, http_client: str
) -> None:
    db = Db(database_url)
    db.enqueue("plain-1", receiver.url + "/plain")
    async with ForwardProxy(credentials=(USER, PASSWORD)) as proxy:
        host_port = proxy.url.removeprefix("http://")
        parsed = Proxy.parse(f"http://us%40er:p%3Ass%20w%25@{host_port}")
        assert parsed.credentials == (USER, PASSWORD)
        config = fast_config(GUARDED, http_client=http_client, proxy=parsed)
        dispatcher = Dispatcher(db.url, config, log=NullLog())
        async with asyncio.timeout(30):
            await dispatcher.run(drain=True)

    assert [r.path for r in receiver.requests] == ["/plain"]
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert [(f.method, f.authorization) for f in proxy.forwarded] == [("POST", expected)]
    assert db.query("SELECT count(*) FROM outbox.delivered") == [(1,)]
