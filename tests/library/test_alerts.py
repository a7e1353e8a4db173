"""Alerts: the outbox's own operational events, delivered as signed webhooks
through the outbox to the endpoints subscribed to them, against a real database,
real receivers on 127.0.0.1 and dispatchers running in-process.

The database raises them in the transaction that makes the change (migration
0028); the lag and unknown keys are raised by dispatchers
(dispatchers.runtime.alerts)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook

from dispatchers.runtime.alerts import LagWatch
from dispatchers.runtime.log import NullLog
from dispatchers.runtime.maintenance import BacklogGauge
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.postgres import Store
from outbox import Outbox
from outbox.admin import message_cancel
from outbox.endpoints import Endpoint, Endpoints
from outbox.sealing import Keyring, generate_key, key_id
from outbox.tenants import Tenants
from tests.dispatching import drain, fast_config, running, wait_until
from tests.receiver import Received, Receiver, Reply


class Db:
    """The test's database, each call on a connection of its own (committed)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def add(self, url: str, event_types: list[str] | None = None, **kwargs: Any) -> Endpoint:
        with psycopg.connect(self.url) as conn:
            return Endpoints(keyring=kwargs.pop("keyring", None)).add(
                conn, url=url, event_types=event_types, **kwargs
            )

    def publish(self, event_type: str, payload: Any, **kwargs: Any) -> list[int]:
        with psycopg.connect(self.url) as conn:
            return Outbox().publish(conn, event_type, payload, **kwargs)

    def alerts(self) -> list[tuple[str, int]]:
        """(type, endpoint) of every alert message written, in order."""
        return [
            (t, e)
            for t, e in self.query(
                "SELECT event_type, endpoint_id FROM outbox.messages"
                " WHERE event_type LIKE 'outbox.%%'"
                " UNION ALL SELECT event_type, endpoint_id FROM outbox.delivered"
                " WHERE event_type LIKE 'outbox.%%' ORDER BY 1, 2"
            )
        ]


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


def verified(endpoint: Endpoint, request: Received) -> dict[str, Any]:
    """The alert ``request`` carried, verified as the Standard Webhooks library does."""
    payload: dict[str, Any] = Webhook(endpoint.secrets[0].secret).verify(
        request.body, request.headers
    )
    return payload


def of_type(receiver: Receiver, event_type: str) -> list[Received]:
    return [r for r in list(receiver.requests) if json.loads(r.body)["type"] == event_type]


async def arrived(receiver: Receiver, count: int) -> list[Received]:
    return await asyncio.to_thread(receiver.wait_for, count, 15)


# -- the acceptance -------------------------------------------------------------------


@pytest.mark.slow
async def test_a_message_that_goes_dead_is_alerted_to_a_subscribed_endpoint_signed(
    db: Db,
) -> None:
    with Receiver(lambda _: Reply(status=400)) as refusing, Receiver() as pager:
        orders = db.add(refusing.url, ["order.*"])
        alerts = db.add(pager.url, ["outbox.*"])
        (dead,) = db.publish("order.paid", {"order": 42}, idempotency_key="order-42")
        async with running(db, fast_config()):
            (request,) = await arrived(pager, 1)
            await wait_until(lambda: db.query("SELECT 1 FROM outbox.delivered") != [])

    alert = verified(alerts, request)
    assert request.headers["webhook-id"] == f"outbox.message.dead:{dead}:1:{alerts.id}"
    assert alert["type"] == "outbox.message.dead"
    data = alert["data"]
    assert data["dead_at"].endswith("Z") and data["created_at"].endswith("Z")
    assert {k: v for k, v in data.items() if k not in ("dead_at", "created_at")} == {
        "message_id": dead,
        "idempotency_key": f"order-42:{orders.id}",
        "event_type": "order.paid",
        "endpoint_id": orders.id,
        "tenant": None,
        "destination": f"endpoint:{orders.id}",
        "attempts": 1,
        "max_attempts": 8,
        "last_status": 400,
        "error_class": "http_400",
        "last_error": "HTTP 400 Bad Request",
    }
    # the alert's own retry schedule, from its event type
    assert db.query(
        "SELECT retry_schedule FROM outbox.event_types WHERE event_type = 'outbox.message.dead'"
    ) == [([10.0, 60.0, 300.0, 900.0, 3600.0],)]
    assert len(refusing.requests) == 1  # the order, and no alert


# -- who gets an alert ----------------------------------------------------------------


def test_an_alert_goes_to_the_operators_endpoints_subscribed_to_it_and_no_other(
    db: Db,
) -> None:
    off = db.add("https://off.example/", ["outbox.*"])
    with psycopg.connect(db.url) as conn:
        Endpoints().disable(conn, off.id)  # before anyone takes that alert
        Tenants().add(conn, "customer-1")
    by_pattern = db.add("https://pager.example/a", ["outbox.*"])
    by_name = db.add("https://pager.example/b", ["order.*", "outbox.message.dead"])
    db.add("https://all.example/", [])  # every event the application publishes
    db.add("https://orders.example/", ["order.*"])
    db.add("https://other.example/", ["outbox.endpoint.*"])
    filtered = db.add("https://filtered.example/", ["outbox.*"], filter="data.n == `7`")
    db.add("https://customer.example/", ["outbox.*"], tenant="customer-1")
    # the endpoint whose message dies subscribes to alerts too: not to its own
    failing = db.add("https://failing.example/", ["order.*", "outbox.*"])
    db.publish("order.paid", {"n": 1})
    [(message,)] = db.query("SELECT id FROM outbox.messages WHERE endpoint_id = %s", failing.id)
    with psycopg.connect(db.url) as conn:
        assert message_cancel(conn, [message]) == [message]

    assert db.alerts() == sorted(
        [
            ("outbox.message.dead", by_pattern.id),
            ("outbox.message.dead", by_name.id),
            ("outbox.message.dead", filtered.id),  # a payload filter is not applied
        ]
    )
    # the event is recorded once per occurrence: the same transition again writes nothing
    db.query("UPDATE outbox.messages SET state = 'ready' WHERE id = %s", message)
    db.query("UPDATE outbox.messages SET state = 'dead' WHERE id = %s", message)
    assert len(db.alerts()) == 3


def test_an_alert_nobody_takes_writes_nothing(db: Db) -> None:
    db.add("https://all.example/", [])
    (message,) = db.publish("order.paid", {"n": 1})
    with psycopg.connect(db.url) as conn:
        message_cancel(conn, [message])
    assert db.alerts() == []
    assert db.query("SELECT count(*) FROM outbox.events") == [(1,)]  # the order's alone


def test_an_application_cannot_publish_the_outboxs_own_types(db: Db) -> None:
    db.add("https://pager.example/", ["outbox.*"])
    with psycopg.connect(db.url) as conn, pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT outbox.publish(event_type => 'outbox.message.dead', payload => '{}')")
    assert caught.value.sqlstate == "OB001"
    assert db.alerts() == []


# -- endpoint disabled, breakers --------------------------------------------------------


@pytest.mark.slow
async def test_a_410_disables_the_endpoint_and_alerts_another_endpoint_not_itself(
    db: Db,
) -> None:
    with Receiver(lambda _: Reply(status=410)) as gone, Receiver() as pager:
        leaving = db.add(gone.url, ["order.*", "outbox.*"])
        alerts = db.add(pager.url, ["outbox.*"])
        db.publish("order.paid", {"n": 1})
        await drain(db, fast_config())

    types = sorted(verified(alerts, r)["type"] for r in pager.requests)
    assert types == ["outbox.endpoint.disabled", "outbox.message.dead"]
    (disabled,) = [verified(alerts, r)["data"] for r in of_type(pager, "outbox.endpoint.disabled")]
    assert disabled["endpoint_id"] == leaving.id
    assert disabled["reason"] == "the endpoint answered 410 Gone"
    assert disabled["origin"] == gone.url  # scheme, host and port: never the path
    assert [json.loads(r.body)["type"] for r in gone.requests] == ["order.paid"]


BREAKER = {
    "breaker_window": 30.0,
    "breaker_min_attempts": 4,
    "breaker_failure_ratio": 0.5,
    "breaker_backoff": 0.5,
    "breaker_backoff_max": 1.0,
}
"""A breaker that opens after four failed attempts and probes half a second later."""


@pytest.mark.slow
async def test_a_breaker_that_opens_and_closes_is_alerted_twice_never_to_its_endpoint(
    db: Db,
) -> None:
    recovered = threading.Event()

    def failing_until_recovered(req: Received) -> Reply:
        return Reply() if recovered.is_set() else Reply(status=503)

    with Receiver(failing_until_recovered) as failing, Receiver() as pager:
        down = db.add(failing.url, ["order.*", "outbox.*"])
        alerts = db.add(pager.url, ["outbox.breaker.*"])
        for n in range(6):
            db.publish("order.paid", {"n": n})
        async with running(db, fast_config(BREAKER, concurrency=2, destination_concurrency=1)):
            (opened,) = await arrived(pager, 1)
            recovered.set()
            closed = (await arrived(pager, 2))[1]

    assert verified(alerts, opened)["type"] == "outbox.breaker.opened"
    assert verified(alerts, closed)["type"] == "outbox.breaker.closed"
    data = verified(alerts, closed)["data"]
    assert data["destination"] == f"endpoint:{down.id}" and data["endpoint_id"] == down.id
    assert data["opened_at"] == verified(alerts, opened)["data"]["opened_at"]
    assert not [r for r in failing.requests if json.loads(r.body)["type"].startswith("outbox.")]


# -- no loops ---------------------------------------------------------------------------


async def test_an_alert_that_goes_dead_raises_no_alert(db: Db) -> None:
    refuse: Callable[[Received], Reply] = lambda _: Reply(status=400)  # noqa: E731
    with Receiver(refuse) as pager, Receiver(refuse) as orders:
        # each would take the alert of the other's dead messages
        db.add(pager.url, ["outbox.*"])
        db.add(orders.url, ["order.*", "outbox.*"])
        db.publish("order.paid", {"n": 1})
        await drain(db, fast_config())

    assert len(orders.requests) == 1  # the order
    assert len(pager.requests) == 1  # the alert of its death, which died too
    assert db.query("SELECT state, count(*) FROM outbox.messages GROUP BY 1") == [("dead", 2)]


# -- raised by dispatchers ----------------------------------------------------------------


async def test_the_lag_alerts_once_per_crossing_however_many_dispatchers_see_it(
    db: Db,
) -> None:
    with Receiver() as pager, Receiver() as slow:
        alerts = db.add(pager.url, ["outbox.lag.*"])
        with psycopg.connect(db.url) as conn:
            Outbox().enqueue(conn, url=slow.url, idempotency_key="late", json={})
            conn.execute("UPDATE outbox.messages SET available_at = now() - interval '2 minutes'")
        config = fast_config()
        stores = [Store(db.url, config), Store(db.url, config)]
        for store in stores:
            await store.open()
        try:
            gauges = [
                BacklogGauge(
                    store,
                    Reporter(NullLog()),
                    interval=1,
                    top=20,
                    lag=LagWatch(store, Reporter(NullLog()), threshold=60),
                )
                for store in stores
            ]

            async def read_by_both() -> list[tuple[str, int]]:
                await asyncio.gather(*(gauge.run_once() for gauge in gauges))
                return db.alerts()

            assert await read_by_both() == [("outbox.lag.exceeded", alerts.id)]
            assert await read_by_both() == [("outbox.lag.exceeded", alerts.id)]
            db.query("UPDATE outbox.messages SET available_at = now() - interval '40 seconds'")
            assert len(await read_by_both()) == 1  # above half the threshold: still late
            db.query("UPDATE outbox.messages SET available_at = now()")
            assert await read_by_both() == [
                ("outbox.lag.exceeded", alerts.id),
                ("outbox.lag.recovered", alerts.id),
            ]
            db.query("UPDATE outbox.messages SET available_at = now() - interval '2 minutes'")
            assert len(await read_by_both()) == 3  # a second crossing
        finally:
            for store in stores:
                await store.close()
        await drain(db, fast_config())

    types = [verified(alerts, r)["type"] for r in pager.requests]
    assert sorted(types) == ["outbox.lag.exceeded", "outbox.lag.exceeded", "outbox.lag.recovered"]
    (recovered,) = of_type(pager, "outbox.lag.recovered")
    data = verified(alerts, recovered)["data"]
    assert data["threshold_seconds"] == 60 and data["oldest_due_seconds"] < 30


async def test_a_secret_under_a_key_the_dispatcher_lacks_alerts_once_per_key_and_hour(
    db: Db,
) -> None:
    held, other = generate_key(), generate_key()
    missing = key_id(base64.b64decode(other))

    def ring(*keys: str) -> Keyring:
        return Keyring([base64.b64decode(k) for k in keys])

    def held_unsent(message: int) -> bool:
        return db.query(
            "SELECT 1 FROM outbox.messages WHERE id = %s AND last_error LIKE 'held unsent: %%'",
            message,
        ) == [(1,)]

    with Receiver() as pager, Receiver() as orders:
        sealed = db.add(orders.url, ["order.*"], keyring=ring(held))
        config = fast_config(keyring=ring(held))
        async with running(db, config):
            # an operator seals under a key this dispatcher was not given
            with psycopg.connect(db.url) as conn:
                assert Endpoints(keyring=ring(other, held)).reseal(conn, limit=10) == 1
            alerts = db.add(pager.url, ["outbox.secrets.*"])  # its secret in plain text
            db.publish("order.paid", {"n": 1})
            (request,) = await arrived(pager, 1)
        # another dispatcher meets the key in the same hour: the database alerts once
        async with running(db, config):
            (second,) = db.publish("order.paid", {"n": 2})
            await wait_until(lambda: held_unsent(second))
    assert orders.requests == []
    assert db.alerts() == [("outbox.secrets.unknown_key", alerts.id)]
    data = verified(alerts, request)["data"]
    assert data["key_id"] == missing and data["endpoint_id"] == sealed.id
    assert data["hour"].endswith(":00Z")
