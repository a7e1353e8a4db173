"""Enqueue and publish into a schema that was never migrated say so, in one error
that names the schema and ``outbox migrate``, on every kind of transaction; so do
the endpoints, policies, event types and operator functions."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from outbox import Outbox, SchemaNotMigrated, admin, migrate
from outbox.destinations import Destinations
from outbox.endpoints import Endpoints
from outbox.event_types import EventTypes
from outbox.migrations import load_migrations
from tests.transactions import Tx


async def test_enqueue_into_an_unmigrated_schema_names_outbox_migrate(tx: Tx) -> None:
    box = Outbox(schema="nowhere")
    with pytest.raises(SchemaNotMigrated) as raised:
        await tx.call(
            box.enqueue,
            box.enqueue_async,
            url="https://api.example.com/charges",
            idempotency_key="k-1",
            json={"card": "4242-card-number"},
        )
    assert raised.value.schema == "nowhere"
    assert "outbox migrate --schema nowhere" in str(raised.value)
    assert raised.value.__cause__ is not None  # the driver's error stays attached
    # the driver's own error: SQLAlchemy's lists the statement's parameters (a
    # message body) for the application's error log to print
    printed = "".join(traceback.format_exception(raised.value))
    assert "nowhere" in printed  # the driver's error names the relation
    assert "4242-card-number" not in printed


async def test_publish_into_an_unmigrated_schema_names_outbox_migrate(tx: Tx) -> None:
    box = Outbox(schema="nowhere")
    with pytest.raises(SchemaNotMigrated, match="outbox migrate --schema nowhere"):
        await tx.call(box.publish, box.publish_async, "order.paid", {"id": 1})


async def test_enqueue_into_a_schema_an_older_version_migrated_names_outbox_migrate(
    empty_database_url: str,
) -> None:
    # the schema as the version before request digests left it (migrations 1-6)
    migrate(empty_database_url, migrations=load_migrations()[:6])
    box = Outbox()
    with psycopg.connect(empty_database_url) as conn, pytest.raises(SchemaNotMigrated) as raised:
        box.enqueue(conn, url="https://api.example.com/charges", idempotency_key="k-1", body="{}")
    assert raised.value.behind
    assert "is behind this version" in str(raised.value)
    assert "outbox migrate --schema outbox" in str(raised.value)


ENTRY_POINTS: dict[str, Callable[[psycopg.Connection[Any]], object]] = {
    "Endpoints.add": lambda c: Endpoints(schema="nowhere").add(
        c, url="https://hooks.example/in", event_types=["order.paid"]
    ),
    "Endpoints.all": lambda c: Endpoints(schema="nowhere").all(c),
    "Destinations.all": lambda c: Destinations(schema="nowhere").all(c),
    "EventTypes.all": lambda c: EventTypes(schema="nowhere").all(c),
    "admin.dead_list": lambda c: admin.dead_list(c, schema="nowhere"),
    "admin.status": lambda c: admin.status(c, schema="nowhere"),
    "admin.message_show": lambda c: admin.message_show(c, 1, schema="nowhere"),
    "admin.replay_message": lambda c: admin.replay_message(c, schema="nowhere", message_id=1),
}


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_each_entry_point_on_an_unmigrated_schema_names_outbox_migrate(
    database_url: str, name: str
) -> None:
    with psycopg.connect(database_url) as conn, pytest.raises(SchemaNotMigrated) as raised:
        ENTRY_POINTS[name](conn)
    assert raised.value.schema == "nowhere"
    assert "outbox migrate --schema nowhere" in str(raised.value)
