"""Enqueue and publish into a schema that was never migrated say so, in one error
that names the schema and ``outbox migrate``, on every kind of transaction."""

from __future__ import annotations

import pytest

from outbox import Outbox, SchemaNotMigrated
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
