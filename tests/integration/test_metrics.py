"""The metrics endpoint reports deliveries; /healthz is up while the database answers
(``tests/faults/test_health_probe.py`` takes the database down)."""

from __future__ import annotations

import asyncio
import re

import httpx
import psycopg

from dispatchers.dispatcher import Dispatcher
from dispatchers.log import NullLog
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
