"""Django's connection as the caller's transaction: ``transaction.atomic`` and its
savepoints decide what is written, as for the application's own rows."""

from __future__ import annotations

import unittest
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import SynchronousOnlyOperation
from django.db import DatabaseError, connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test import TestCase

from outbox import ConfigurationError, Endpoints, Inbox, Outbox, SchemaNotMigrated
from tests.django_project import use_database
from tests.transactions import Observer

URL = "http://127.0.0.1:9/orders"
box = Outbox()


@pytest.fixture(autouse=True)
def django_database(database_url: str) -> Iterator[None]:
    use_database(database_url)
    yield
    connections.close_all()


def enqueue(key: str) -> int:
    return box.enqueue(connection, url=URL, idempotency_key=key, json={"key": key})


def keys(observer: Observer) -> list[str]:
    rows = observer.execute("SELECT idempotency_key FROM outbox.messages ORDER BY id")
    return [key for (key,) in rows]


def test_a_committed_atomic_block_writes_its_messages_and_a_rolled_back_one_none(
    observer: Observer,
) -> None:
    with transaction.atomic():
        enqueue("kept")
        assert keys(observer) == []  # not before the commit
    with pytest.raises(RuntimeError), transaction.atomic():
        box.enqueue(connections["default"], url=URL, idempotency_key="lost", json={})
        raise RuntimeError("the view failed")
    assert keys(observer) == ["kept"]


def test_a_rolled_back_savepoint_takes_its_messages_and_only_those(observer: Observer) -> None:
    with transaction.atomic():
        enqueue("outer")
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue("inner")
            raise RuntimeError("the inner block failed")
        with transaction.atomic():
            enqueue("inner-kept")
    assert keys(observer) == ["outer", "inner-kept"]


def test_publish_and_inbox_claim_belong_to_the_atomic_block(observer: Observer) -> None:
    with transaction.atomic():
        endpoint = Endpoints().add(connection, url=URL, event_types=["order.created"])
        box.publish(connection, "order.created", {"id": 1}, idempotency_key="o1")
    inbox = Inbox()
    with transaction.atomic():
        inbox.ensure_schema(connection)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert inbox.claim(connection, "k") is True
        raise RuntimeError("the handler failed")
    with transaction.atomic():
        assert inbox.claim(connection, "k") is True  # claimable again after the rollback
        assert inbox.claim(connection, "k") is False
    assert keys(observer) == [f"o1:{endpoint.id}"]


def test_a_broken_atomic_block_refuses_to_enqueue(observer: Observer) -> None:
    with transaction.atomic():
        # an error leaving a block without a savepoint breaks the whole transaction
        with pytest.raises(DatabaseError), transaction.atomic(savepoint=False):
            connection.cursor().execute("SELECT 1/0")
        with pytest.raises(TransactionManagementError):
            enqueue("after-error")
        transaction.set_rollback(True)
    assert keys(observer) == []


def test_a_missing_schema_is_named_through_djangos_errors() -> None:
    with pytest.raises(SchemaNotMigrated), transaction.atomic():
        Outbox(schema="nowhere").enqueue(connection, url=URL, idempotency_key="k", json={})
    with pytest.raises(ConfigurationError, match="ensure_schema"), transaction.atomic():
        Inbox(schema="nowhere").claim(connection, "k")


def test_in_a_django_testcase_messages_are_seen_through_its_connection_only(
    observer: Observer,
) -> None:
    seen: list[list[str]] = []

    class PlaceOrder(TestCase):
        def test_enqueues(self) -> None:
            enqueue("in-test")
            with connection.cursor() as cur:
                cur.execute("SELECT idempotency_key FROM outbox.messages")
                seen.append([key for (key,) in cur.fetchall()])
            seen.append(keys(observer))

    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(PlaceOrder).run(result)
    assert result.wasSuccessful(), result.errors + result.failures
    assert seen == [["in-test"], []]  # its connection sees it; no other does
    assert keys(observer) == []  # and the test's rollback removed it


async def test_from_async_code_the_transaction_runs_in_sync_to_async(observer: Observer) -> None:
    @sync_to_async
    @transaction.atomic
    def place_order() -> int:
        return enqueue("async-view")

    try:
        await place_order()
        assert keys(observer) == ["async-view"]
        with pytest.raises(TypeError, match="sync_to_async"):
            await box.enqueue_async(connection, url=URL, idempotency_key="k", json={})
        with pytest.raises(SynchronousOnlyOperation):
            enqueue("from-the-event-loop")
    finally:
        # Django's connections belong to a thread: the one sync_to_async opened lives
        # in asgiref's executor thread and must be closed there, or the next test of
        # this process reuses it against a database that has been dropped.
        await sync_to_async(connections.close_all)()
