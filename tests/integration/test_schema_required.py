"""Enqueue and publish into a schema that was never migrated say so, in one error
that names the schema and ``outbox migrate``, on every kind of transaction."""

from __future__ import annotations

import psycopg
import pytest

from outbox import Outbox, SchemaNotMigrated, migrate
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
            json={"amount": 1},
        )
    assert raised.value.schema == "nowhere"
    assert "outbox migrate --schema nowhere" in str(raised.value)
    assert raised.value.__cause__ is not None  # the driver's error stays attached


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
