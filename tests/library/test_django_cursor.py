"""The outbox's statements on Django's connection go through Django's own cursor:
an ``execute_wrapper`` sees each of them (both rounds of a filtered publish), a
wrapper that refuses a query refuses the outbox's too, ``DEBUG`` query logging
records them, and they stay in the caller's ``atomic`` block all the while."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from outbox import Outbox
from outbox.endpoints import Endpoints
from tests.django_project import use_database
from tests.transactions import Observer

URL = "http://127.0.0.1:9/orders"
box = Outbox()


@pytest.fixture(autouse=True)
def django_database(database_url: str) -> Iterator[None]:
    use_database(database_url)
    yield
    connections.close_all()


class Recorder:
    """An ``execute_wrapper`` that records the SQL of each query, then runs it."""

    def __init__(self) -> None:
        self.seen: list[bytes | str] = []

    def __call__(
        self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
    ) -> Any:
        self.seen.append(sql)
        return execute(sql, params, many, context)


def statement(name: str) -> bytes:
    """The text the outbox runs for statement ``name``, as its cursor is given it."""
    if box.notify and name in ("enqueue", "publish"):
        name += "_notify"
    return box.queries[name].query


def messages(observer: Observer) -> list[str]:
    rows = observer.execute("SELECT idempotency_key FROM outbox.messages ORDER BY id")
    return [key for (key,) in rows]


def test_an_execute_wrapper_sees_every_outbox_statement_of_a_rolled_back_block(
    observer: Observer,
) -> None:
    with transaction.atomic():
        endpoint = Endpoints().add(connection, url=URL, filter="n > `0`")
    recorder = Recorder()
    with (
        pytest.raises(RuntimeError, match="the view failed"),
        connection.execute_wrapper(recorder),
        transaction.atomic(),
    ):
        box.enqueue(connection, url=URL, idempotency_key="k1", json={})
        box.publish(connection, "order.paid", {"n": 1}, idempotency_key="e1")
        # written in the block, seen through its own connection...
        with connection.cursor() as cur:
            cur.execute("SELECT idempotency_key FROM outbox.messages ORDER BY id")
            assert [k for (k,) in cur.fetchall()] == ["k1", f"e1:{endpoint.id}"]
        raise RuntimeError("the view failed")

    # the enqueue, then both rounds of the filtered publish (the first learns the
    # filter and writes nothing), then the test's own query, all through the wrapper
    assert recorder.seen[:3] == [statement("enqueue"), statement("publish"), statement("publish")]
    assert len(recorder.seen) == 4
    # ...and gone with the block
    assert messages(observer) == []


def test_a_wrapper_that_refuses_a_query_refuses_the_enqueue_and_nothing_is_written(
    observer: Observer,
) -> None:
    class Refused(Exception):
        pass

    def refuse(*args: Any) -> Any:
        raise Refused("queries are not allowed here")

    with transaction.atomic():
        box.enqueue(connection, url=URL, idempotency_key="before", json={})
        with pytest.raises(Refused), connection.execute_wrapper(refuse):
            box.enqueue(connection, url=URL, idempotency_key="refused", json={})
        box.enqueue(connection, url=URL, idempotency_key="after", json={})
    assert messages(observer) == ["before", "after"]


def test_debug_query_logging_records_the_outbox_statements(observer: Observer) -> None:
    with CaptureQueriesContext(connection) as logged, transaction.atomic():
        box.enqueue(connection, url=URL, idempotency_key="logged", json={})
    logged_sql = [query["sql"] for query in logged.captured_queries]
    assert any('INSERT INTO "outbox".messages' in text for text in logged_sql), logged_sql
    assert messages(observer) == ["logged"]
