"""An endpoint's filter changed by another connection, committed between the two
statements of a filtered ``publish``: the event goes to that endpoint only if the
new filter passes, never on the verdict given to the old one.

The change is made from inside the publisher's own driver, right after its first
``publish`` statement returned (a psycopg cursor, or a SQLAlchemy
``after_cursor_execute`` hook), so the interleaving is exact: the first statement
saw the old filter, everything after it sees the new one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, event

from outbox import Outbox
from outbox.dsn import sqlalchemy_url
from outbox.endpoints import Endpoints
from tests.transactions import Observer

PUBLISH_MARK = "unevaluated AS ("
"""Text found in the ``publish`` statement alone (sql/queries/enqueue.sql)."""

BIG, SMALL = "amount > `100`", "amount <= `100`"


class Interleaver:
    """Counts the ``publish`` statements a transaction runs, and runs ``between``
    once, right after the first of them returned."""

    def __init__(self, between: Callable[[], None]) -> None:
        self.between = between
        self.publishes = 0

    def after(self, statement: str) -> None:
        if PUBLISH_MARK not in statement:
            return
        self.publishes += 1
        if self.publishes == 1:
            self.between()


@contextmanager
def publisher(kind: str, url: str, interleaver: Interleaver) -> Iterator[Any]:
    """A transaction of ``kind`` whose statements go through ``interleaver``."""
    if kind == "psycopg":

        class Cursor(psycopg.Cursor[Any]):
            def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                result = super().execute(query, params, **kwargs)
                if isinstance(query, bytes):
                    query = query.decode()
                elif not isinstance(query, str):
                    query = query.as_string(self.connection)
                interleaver.after(query)
                return result

        with psycopg.connect(url, cursor_factory=Cursor) as conn:
            yield conn
        return
    engine = create_engine(sqlalchemy_url(url))

    def after_cursor_execute(*args: Any) -> None:
        interleaver.after(args[2])  # conn, cursor, statement, ...

    event.listen(engine, "after_cursor_execute", after_cursor_execute)
    try:
        with engine.connect() as connection:
            yield connection
            connection.commit()
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", ["psycopg", "sqlalchemy"])
@pytest.mark.parametrize(
    ("old", "new", "sent"),
    [
        pytest.param(BIG, SMALL, False, id="old-passes-new-fails"),
        pytest.param(SMALL, BIG, True, id="old-fails-new-passes"),
    ],
)
def test_a_filter_changed_between_the_publish_statements_is_judged_anew(
    database_url: str, observer: Observer, kind: str, old: str, new: str, sent: bool
) -> None:
    endpoints = Endpoints()
    with psycopg.connect(database_url) as conn:
        changed = endpoints.add(conn, url="https://changed.example/", filter=old)
        steady = endpoints.add(conn, url="https://steady.example/", filter="amount > `0`")

    def change_filter() -> None:
        # another connection, committed before the publisher's next statement
        with psycopg.connect(database_url) as other:
            endpoints.update(other, changed.id, filter=new)

    interleaver = Interleaver(change_filter)
    with publisher(kind, database_url, interleaver) as tx:
        ids = Outbox().publish(tx, "order.paid", {"amount": 150}, idempotency_key="evt-1")

    # the first round learnt the old filter, the second met the new one unjudged
    # (nothing written), the third wrote with the new filter's verdict
    assert interleaver.publishes == 3
    assert observer.execute(
        "SELECT filter FROM outbox.endpoints WHERE id = %s", (changed.id,)
    ).fetchall() == [(new,)]
    rows = observer.execute(
        "SELECT endpoint_id, idempotency_key FROM outbox.messages ORDER BY endpoint_id"
    ).fetchall()
    expected = [(steady.id, f"evt-1:{steady.id}")]
    if sent:
        expected.insert(0, (changed.id, f"evt-1:{changed.id}"))
    assert rows == expected
    assert sorted(ids) == sorted(
        mid for (mid,) in observer.execute("SELECT id FROM outbox.messages")
    )
    (event_ids,) = observer.execute(
        "SELECT message_ids FROM outbox.events WHERE event_key = 'evt-1'"
    ).fetchone() or (None,)
    assert event_ids == sorted(ids)
