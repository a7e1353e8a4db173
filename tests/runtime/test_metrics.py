"""The metrics endpoint reports deliveries; /healthz is up while the database answers
(``tests/faults/test_health_probe.py`` takes the database down)."""

from __future__ import annotations

import asyncio
import re

import httpx
import psycopg
import pytest

from dispatchers.runtime import metrics as metrics_module
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from outbox import Outbox
from tests.dispatching import fast_config, wait_until
from tests.receiver import Receiver, Reply

DELIVERED = '{outcome="delivered"}'


def sample(text: str, name: str, labels: str = "", *, absent: float | None = None) -> float:
    """The value of one sample of the exposition ``text``. A labelled sample appears
    with its first count: with ``absent`` given, a missing one of a declared family
    reads as ``absent``."""
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    if match is None and absent is not None:
        assert re.search(rf"^# TYPE {re.escape(name)} ", text, re.MULTILINE), f"{name} missing"
        return absent
    assert match, f"{name}{labels} missing"
    return float(match.group(1))


@pytest.mark.slow
async def test_metrics_change_as_messages_are_delivered(database_url: str) -> None:
    replies = iter([Reply(status=503)] + [Reply()] * 10)
    with Receiver(lambda req: next(replies)) as receiver:
        dispatcher = Dispatcher(database_url, fast_config(metrics_port=0), log=NullLog())
        task = asyncio.create_task(dispatcher.run())
        try:
            await wait_until(lambda: dispatcher.metrics_server is not None)
            assert dispatcher.metrics_server is not None
            port = dispatcher.metrics_server.sockets[0].getsockname()[1]
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient() as client:
                before = (await client.get(base + "/metrics")).text
                assert sample(before, "outbox_deliveries_total", DELIVERED, absent=0) == 0
                assert (await client.get(base + "/healthz")).status_code == 200
                with psycopg.connect(database_url) as conn:
                    for i in range(3):
                        Outbox().enqueue(conn, url=receiver.url, idempotency_key=f"m{i}", json={})
                await wait_until(lambda: dispatcher.stats.delivered == 3)
                after = (await client.get(base + "/metrics")).text
                assert (await client.get(base + "/nope")).status_code == 404
                assert (await client.get(base + "/livez")).status_code == 200
        finally:
            dispatcher.stop()
            await task
    assert sample(after, "outbox_deliveries_total", DELIVERED) == 3
    assert sample(after, "outbox_deliveries_total", '{outcome="retry"}') == 1
    assert sample(after, "outbox_attempt_duration_seconds_count") == 4
    assert sample(after, "outbox_commit_to_delivery_seconds_count") == 3
    assert sample(after, "outbox_claims_total") >= 2
    assert sample(after, "outbox_in_flight") == 0
    assert sample(after, "outbox_lease_lost_total") == 0


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection (an end or a reset) without a word."""
    try:
        return await reader.read() == b""
    except ConnectionResetError:
        return True


async def probe(port: int) -> bytes:
    """What the server answers a whole request for /livez (b"" when it hangs up)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(30):
            return await reader.read()
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def test_clients_that_hold_connections_open_cannot_take_the_metrics_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_module, "HEADER_SECONDS", 600.0)  # longer than the test
    server = await metrics_module.serve(
        metrics_module.Metrics(), host="127.0.0.1", port=0, healthy=lambda: True
    )
    port = server.sockets[0].getsockname()[1]
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        # more clients than the bound, each sending part of its headers and no more
        for _ in range(metrics_module.MAX_CONNECTIONS + 20):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
            held.append((reader, writer))
        # those past the bound are closed on arrival, long before their headers' time
        async with asyncio.timeout(30):
            extra = held[metrics_module.MAX_CONNECTIONS :]
            assert all(await asyncio.gather(*(closed(reader) for reader, _ in extra)))
        assert await probe(port) == b""  # full: a whole request is turned away too
        for _, writer in held:
            writer.close()
        # once they let go, the server answers again
        deadline = asyncio.get_running_loop().time() + 30
        while not (answer := await probe(port)):
            assert asyncio.get_running_loop().time() < deadline, "never answered again"
            await asyncio.sleep(0.05)
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"alive\n")
    finally:
        for _, writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_client_that_never_ends_its_headers_is_hung_up_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_module, "HEADER_SECONDS", 0.5)
    server = await metrics_module.serve(
        metrics_module.Metrics(), host="127.0.0.1", port=0, healthy=lambda: True
    )
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
        async with asyncio.timeout(30):
            assert await closed(reader)
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
