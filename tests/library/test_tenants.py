"""Tenants against real PostgreSQL: their endpoints, publish for one tenant,
event keys that are each tenant's own, the defaults endpoints take, deletion,
and delivery through a dispatcher to a receiver on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psycopg
import pytest

from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from outbox import InvalidArgument, InvalidMessage, Outbox, Tenants
from outbox.endpoints import Endpoints
from tests.dispatching import fast_config
from tests.plans import explain, indexes, seq_scans
from tests.receiver import Receiver

Conn = psycopg.Connection[tuple[Any, ...]]


class Db:
    def __init__(self, url: str) -> None:
        self.url = url
        self.tenants = Tenants()
        self.endpoints = Endpoints()
        self.box = Outbox()

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def count(self, table: str) -> int:
        return int(self.query(f"SELECT count(*) FROM outbox.{table}")[0][0])

    def tenant(self, external_id: str, **kwargs: Any) -> Any:
        with psycopg.connect(self.url) as conn:
            return self.tenants.add(conn, external_id, **kwargs)

    def endpoint(self, url: str = "https://example.com/wh", **kwargs: Any) -> Any:
        with psycopg.connect(self.url) as conn:
            return self.endpoints.add(conn, url=url, **kwargs)

    def publish(self, event_type: str, payload: Any, **kwargs: Any) -> list[int]:
        with psycopg.connect(self.url) as conn:
            return self.box.publish(conn, event_type, payload, **kwargs)

    def targets(self, ids: list[int]) -> list[int]:
        rows = self.query(
            "SELECT endpoint_id FROM outbox.messages WHERE id = ANY(%s) ORDER BY endpoint_id", ids
        )
        return [row[0] for row in rows]


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


def test_a_tenant_is_created_read_listed_and_updated(db: Db) -> None:
    made = db.tenant(
        "customer-17", name="Customer 17", metadata={"plan": "gold"}, retry_schedule=[1, 5]
    )
    assert (made.external_id, made.name, made.metadata) == (
        "customer-17",
        "Customer 17",
        {"plan": "gold"},
    )
    assert (made.retry_schedule, made.rate_limit_per_s, made.endpoints) == ([1.0, 5.0], None, 0)
    with psycopg.connect(db.url) as conn:
        assert db.tenants.get(conn, "customer-17") == made
        assert db.tenants.get(conn, "customer-18") is None
        changed = db.tenants.update(conn, "customer-17", name="Renamed", rate_limit=5)
    assert (changed.name, changed.metadata, changed.rate_limit_per_s, changed.burst) == (
        "Renamed",
        {"plan": "gold"},
        5.0,
        5,
    )
    assert changed.retry_schedule == [1.0, 5.0]
    with psycopg.connect(db.url) as conn:
        cleared = db.tenants.update(conn, "customer-17", clear_retry_schedule=True)
    assert cleared.retry_schedule is None and cleared.rate_limit_per_s == 5.0


def test_tenants_are_listed_a_page_at_a_time_by_external_id(db: Db) -> None:
    for name in ("c", "a", "d", "b", "e"):
        db.tenant(name)
    with psycopg.connect(db.url) as conn:
        first = db.tenants.all(conn, limit=2)
        second = db.tenants.all(conn, after=first[-1].external_id, limit=2)
        last = db.tenants.all(conn, after=second[-1].external_id, limit=2)
    pages = [[t.external_id for t in page] for page in (first, second, last)]
    assert pages == [["a", "b"], ["c", "d"], ["e"]]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"external_id": ""}, "external_id"),
        ({"external_id": "-leading-dash"}, "external_id"),
        ({"external_id": "has space"}, "external_id"),
        ({"external_id": "x" * 129}, "external_id"),
        ({"external_id": "ok", "name": "n" * 201}, "name"),
        ({"external_id": "ok", "metadata": ["not", "a", "mapping"]}, "metadata"),
        ({"external_id": "ok", "burst": 3}, "burst"),
        ({"external_id": "ok", "retry_schedule": [0]}, "retry_schedule"),
    ],
)
def test_bad_tenant_input_is_refused_naming_the_field_and_writes_nothing(
    db: Db, kwargs: dict[str, Any], field: str
) -> None:
    kwargs = dict(kwargs)  # the parameter is shared by every server's run
    external_id = kwargs.pop("external_id")
    with pytest.raises(InvalidMessage) as caught:
        db.tenant(external_id, **kwargs)
    assert caught.value.field == field
    assert db.count("tenants") == 0


def test_a_taken_external_id_is_refused_and_the_first_tenant_is_kept(db: Db) -> None:
    db.tenant("customer-17", name="first")
    with pytest.raises(InvalidArgument) as caught:
        db.tenant("customer-17", name="second")
    assert caught.value.field == "external_id" and "exists already" in str(caught.value)
    assert db.query("SELECT name FROM outbox.tenants") == [("first",)]


def test_publish_for_a_tenant_reaches_its_endpoints_only(db: Db) -> None:
    # Each publish is of a type that every endpoint but the one its assertion is
    # about would take: each assertion fails on its own when its rule breaks.
    db.tenant("customer-17")
    db.tenant("customer-18")
    orders = db.endpoint(tenant="customer-17", event_types=["order.*"]).id
    invoices = db.endpoint(tenant="customer-17", event_types=["invoice.paid"]).id
    theirs = db.endpoint(tenant="customer-18").id
    operator = db.endpoint().id
    # the tenant's endpoints subscribed to the type: not the other tenant's, not the operator's
    assert db.targets(db.publish("order.created", {"n": 1}, tenant="customer-17")) == [orders]
    assert db.targets(db.publish("invoice.paid", {"n": 1}, tenant="customer-17")) == [invoices]
    # the other tenant's, though the first tenant's orders endpoint takes the type
    assert db.targets(db.publish("order.created", {"n": 1}, tenant="customer-18")) == [theirs]
    # without a tenant: the operator's endpoints, never a tenant's
    assert db.targets(db.publish("order.created", {"n": 1})) == [operator]


def test_each_tenant_has_its_own_event_keys(db: Db) -> None:
    db.tenant("customer-17")
    db.tenant("customer-18")
    a = db.endpoint(tenant="customer-17").id
    b = db.endpoint(tenant="customer-18").id
    first = db.publish("order.created", {"n": 1}, tenant="customer-17", idempotency_key="order-1")
    other = db.publish("order.created", {"n": 2}, tenant="customer-18", idempotency_key="order-1")
    assert db.targets(first) == [a] and db.targets(other) == [b]
    # published again for the same tenant: the first ids, nothing written
    again = db.publish("order.created", {"n": 1}, tenant="customer-17", idempotency_key="order-1")
    assert again == first and db.count("messages") == 2
    rows = db.query(
        "SELECT t.external_id FROM outbox.events AS e"
        " JOIN outbox.tenants AS t ON t.id = e.tenant_id ORDER BY 1"
    )
    assert rows == [("customer-17",), ("customer-18",)]


def test_publish_for_a_tenant_not_created_writes_nothing(db: Db) -> None:
    db.endpoint()
    assert db.publish("order.created", {"n": 1}, tenant="customer-99") == []
    assert db.count("messages") == 0 and db.count("events") == 0


def test_publish_refuses_a_malformed_tenant_naming_it(db: Db) -> None:
    with pytest.raises(InvalidMessage) as caught:
        db.publish("order.created", {"n": 1}, tenant="not a tenant id")
    assert caught.value.field == "tenant"


def test_an_endpoint_takes_its_tenants_defaults_unless_given_its_own(db: Db) -> None:
    db.tenant("customer-17", rate_limit=2.5, burst=4, retry_schedule=[10, 60])
    inherited = db.endpoint(tenant="customer-17")
    assert (inherited.tenant, inherited.rate_limit_per_s, inherited.burst) == (
        "customer-17",
        2.5,
        4,
    )
    assert inherited.retry_schedule == [10.0, 60.0]
    own = db.endpoint(tenant="customer-17", rate_limit=9, retry_schedule=[3])
    assert (own.rate_limit_per_s, own.burst, own.retry_schedule) == (9.0, 9, [3.0])
    # the inherited rate limit is enforced like any endpoint's: it has its slots
    slots = db.query(
        "SELECT count(*) FROM outbox.rate_slots WHERE destination = %s",
        f"endpoint:{inherited.id}",
    )
    assert slots == [(4,)]
    with psycopg.connect(db.url) as conn:
        assert [e.id for e in db.endpoints.all(conn, tenant="customer-17")] == [
            inherited.id,
            own.id,
        ]
        assert db.endpoints.require(conn, inherited.id).as_dict()["tenant"] == "customer-17"


def test_an_endpoint_for_an_unknown_tenant_is_refused_and_not_written(db: Db) -> None:
    with pytest.raises(InvalidArgument) as caught:
        db.endpoint(tenant="customer-99")
    assert caught.value.field == "tenant"
    assert db.count("endpoints") == 0


def test_deleting_a_tenant_deletes_its_endpoints_and_their_waiting_messages_die(db: Db) -> None:
    db.tenant("customer-17")
    db.tenant("customer-18")
    gone = db.endpoint(tenant="customer-17").id
    kept = db.endpoint(tenant="customer-18").id
    doomed = db.publish("order.created", {"n": 1}, tenant="customer-17")
    survivor = db.publish("order.created", {"n": 1}, tenant="customer-18")
    with psycopg.connect(db.url) as conn:
        deleted = db.tenants.delete(conn, "customer-17")
    assert (deleted.endpoints, deleted.messages) == (1, 1)
    assert [row[0] for row in db.query("SELECT id FROM outbox.endpoints")] == [kept]
    assert db.query("SELECT state FROM outbox.messages WHERE id = %s", doomed[0]) == [("dead",)]
    assert db.query("SELECT state FROM outbox.messages WHERE id = %s", survivor[0]) == [("ready",)]
    assert db.query("SELECT external_id FROM outbox.tenants") == [("customer-18",)]
    with psycopg.connect(db.url) as conn, pytest.raises(InvalidArgument) as caught:
        db.tenants.delete(conn, "customer-17")
    assert caught.value.field == "external_id" and gone != kept


def test_the_fan_out_reads_the_tenants_endpoints_by_index(db: Db) -> None:
    """With many tenants' endpoints, publish for one tenant, and for none,
    probes endpoints_fanout_idx rather than reading every endpoint, and looks up
    each endpoint's key rather than reading every key."""
    with psycopg.connect(db.url) as conn:
        conn.execute(
            "INSERT INTO outbox.tenants (external_id)"
            " SELECT 't-' || g FROM generate_series(1, 2000) AS g"
        )
        conn.execute(
            "INSERT INTO outbox.endpoints (url, tenant_id)"
            " SELECT 'https://example.com/' || g, 1 + g % 2000 FROM generate_series(1, 20000) AS g"
        )
        # keys of earlier events: each endpoint's is looked up, never all read
        conn.execute(
            "INSERT INTO outbox.message_keys (target, idempotency_key, message_id)"
            " SELECT 'endpoint:' || g, 'old:' || g, g FROM generate_series(1, 5000) AS g"
        )
        conn.execute("ANALYZE outbox.endpoints")
        conn.execute("ANALYZE outbox.message_keys")
    statement = db.box.queries["publish"]
    for tenant, prepared in [("t-7", True), (None, True), ("t-7", False), (None, False)]:
        params = {
            "tenant": tenant,
            "event_type": "order.created",
            "event_key": "k",
            "digest": b"\0" * 32,
            "body": b"{}",
            "ordering_key": None,
            "max_attempts": 3,
            "trace_context": None,
            "evaluated": [],
            "matched": [],
        }
        plan = explain(db.url, statement, params, prepared=prepared)
        assert "endpoints_fanout_idx" in indexes(plan), (tenant, prepared, plan)
        assert seq_scans(plan, "endpoints") == [], (tenant, prepared, plan)
        assert seq_scans(plan, "message_keys") == [], (tenant, prepared, plan)


async def test_a_tenants_event_is_delivered_signed_to_its_endpoint(db: Db) -> None:
    db.tenant("customer-17")
    with Receiver() as receiver:
        endpoint = db.endpoint(receiver.url, tenant="customer-17")
        db.endpoint(receiver.url + "?operator")  # the operator's: gets nothing
        (message_id,) = db.publish(
            "order.created", {"order": 1}, tenant="customer-17", idempotency_key="order-1"
        )
        dispatcher = Dispatcher(db.url, fast_config(), log=NullLog())
        async with asyncio.timeout(30):
            await dispatcher.run(drain=True)
        (request,) = receiver.requests
    assert request.headers["webhook-id"] == f"order-1:{endpoint.id}"
    assert json.loads(request.body)["data"] == {"order": 1}
    assert db.query("SELECT id FROM outbox.delivered") == [(message_id,)]


def test_the_sql_function_publishes_for_a_tenant_as_the_library_does(db: Db) -> None:
    db.tenant("customer-17")
    mine = db.endpoint(tenant="customer-17").id
    db.endpoint()
    with psycopg.connect(db.url) as conn:
        (ids,) = conn.execute(
            "SELECT outbox.publish('order.created', '{\"n\": 1}', idempotency_key => 'o-1',"
            " tenant => 'customer-17')"
        ).fetchone()
        (none,) = conn.execute(
            "SELECT outbox.publish('order.created', '{}', tenant => 'customer-99')"
        ).fetchone()
    assert db.targets(ids) == [mine] and none == []
    # the library publishing the same event for the same tenant finds it
    assert db.publish("order.created", {"n": 1}, tenant="customer-17", idempotency_key="o-1") == ids


def test_an_old_event_is_replayed_to_a_new_endpoint_of_the_same_tenant_only(db: Db) -> None:
    from outbox.admin import replay_event

    db.tenant("customer-17")
    db.tenant("customer-18")
    db.endpoint(tenant="customer-17")
    db.endpoint(tenant="customer-18")
    db.publish("order.created", {"for": 17}, tenant="customer-17", idempotency_key="order-1")
    db.publish("order.created", {"for": 18}, tenant="customer-18", idempotency_key="order-1")
    later = db.endpoint(tenant="customer-18").id
    with psycopg.connect(db.url) as conn:
        replayed = replay_event(conn, event_key="order-1", endpoint_id=later)
    (body,) = db.query("SELECT body FROM outbox.messages WHERE endpoint_id = %s", later)
    assert json.loads(bytes(body[0]))["data"] == {"for": 18}, replayed
    (ids,) = db.query(
        "SELECT e.message_ids FROM outbox.events AS e"
        " JOIN outbox.tenants AS t ON t.id = e.tenant_id WHERE t.external_id = 'customer-18'"
    )
    assert len(ids[0]) == 2
