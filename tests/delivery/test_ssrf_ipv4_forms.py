"""A host written as an IPv4 address in a non-canonical form (``127.1``,
``2130706433``) is an invalid URL to both HTTP clients alike, whatever the SSRF
policy: the C resolver reads it as an address that URL parsers read otherwise or
refuse. (Enqueue refuses such URLs; these would be rows from before that check.)"""

from __future__ import annotations

import asyncio
import socket
import threading

import aiohttp
import pytest

from dispatchers.delivery.http import Attempt, Sender
from dispatchers.delivery.outcome import Verdict
from dispatchers.delivery.ssrf import AddressPolicy, GuardedResolver
from dispatchers.runtime.config import DispatcherConfig
from tests.dispatching import fast_config
from tests.jobs import job
from tests.rawserver import RawServer, read_request

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def answer_ok(conn: socket.socket, closed: threading.Event) -> None:
    while not closed.is_set() and read_request(conn):
        conn.sendall(OK)


@pytest.mark.parametrize("http_client", ["aiohttp", "httpx"])
@pytest.mark.parametrize("host", ["127.1", "2130706433", "017700000001", "0x7f.1", "127.0.1"])
async def test_both_clients_fail_a_non_canonical_ipv4_host_as_invalid_even_when_private_is_allowed(
    http_client: str, host: str
) -> None:
    config = fast_config(
        http_client=http_client,
        allow_private_networks=True,
        request_timeout=2.0,
        connect_timeout=1.0,
        lease=9.0,
    )
    with RawServer(answer_ok) as server:
        canonical = await _send(config, server.url())
        attempt = await _send(config, server.url(host))
        assert server.connections == 1  # the canonical form's only
    assert canonical.outcome.verdict is Verdict.DELIVERED
    assert (attempt.outcome.verdict, attempt.outcome.error_class) == (
        Verdict.FAILED,
        "invalid_url",
    )
    assert "canonical" in (attempt.outcome.error or "")


async def test_the_aiohttp_resolver_refuses_a_non_canonical_ipv4_host_too() -> None:
    """aiohttp refuses these hosts before resolving; its resolver does too, should
    one reach it."""
    resolver = GuardedResolver(AddressPolicy(allow_private_networks=True))
    with pytest.raises(aiohttp.InvalidURL, match="non-canonical"):
        await resolver.resolve("127.1", 80)


async def _send(config: DispatcherConfig, url: str) -> Attempt:
    sender = Sender(config)
    try:
        async with asyncio.timeout(10):
            return await sender.send(job(url=url))
    finally:
        await sender.aclose()
