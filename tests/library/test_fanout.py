"""Fan-out end to end: each endpoint receives exactly the committed events it
subscribes to, each once, signed."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import psycopg
from standardwebhooks.webhooks import Webhook

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from outbox import Outbox
from outbox.endpoints import Endpoints
from tests.dispatching import fast_config
from tests.receiver import Receiver

TYPES = ["order.created", "order.paid", "invoice.sent", "user.deleted"]


async def test_three_endpoints_receive_exactly_their_committed_events(database_url: str) -> None:
    with Receiver() as receiver, psycopg.connect(database_url) as conn:
        endpoints = Endpoints()
        subscriptions = {
            "/orders": ["order.*"],
            "/billing": ["order.paid", "invoice.sent"],
            "/everything": [],
        }
        secrets = {}
        for path, types in subscriptions.items():
            endpoint = endpoints.add(conn, url=receiver.url + path, event_types=types)
            secrets[path] = endpoint.secrets[0].secret
        conn.commit()
        box = Outbox()
        committed: list[tuple[str, str]] = []
        for i in range(100):
            event_type = TYPES[i % len(TYPES)]
            key = f"event-{i}"
            with conn.transaction(force_rollback=i % 7 == 3):  # some roll back on purpose
                conn.execute("SELECT 1")  # the business write would be here
                box.publish(conn, event_type, {"n": i}, idempotency_key=key)
            if i % 7 != 3:
                committed.append((event_type, key))

        dispatcher = Dispatcher(database_url, fast_config(concurrency=16), log=NullLog())
        async with asyncio.timeout(60):
            await dispatcher.run(drain=True)

    def wanted(path: str) -> Counter[str]:
        types = subscriptions[path]
        return Counter(
            key
            for event_type, key in committed
            if not types
            or event_type in types
            or any(t.endswith(".*") and event_type.startswith(t[:-1]) for t in types)
        )

    received: dict[str, Counter[str]] = {path: Counter() for path in subscriptions}
    for request in receiver.requests:
        Webhook(secrets[request.path]).verify(request.body, request.headers)
        event = json.loads(request.body)
        received[request.path][f"event-{event['data']['n']}"] += 1
        assert request.headers["webhook-id"].startswith(f"event-{event['data']['n']}:")
    for path in subscriptions:
        assert received[path] == wanted(path), path
        assert set(received[path].values()) == {1}
    assert sum(len(wanted(p)) for p in subscriptions) == dispatcher.stats.delivered
    assert len(committed) == 86  # 14 of the 100 rolled back (i % 7 == 3)
