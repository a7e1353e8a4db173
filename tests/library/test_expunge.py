"""Erasure against real PostgreSQL: what messages said is replaced with a marker
in the hot table and the history, the record is kept, waiting messages are
cancelled, running ones left alone, and every replay of an expunged event or
message is refused."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from dispatchers.cli import main
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from outbox import InvalidArgument, Outbox, Tenants
from outbox.admin import EXPUNGED_BODY, dead_retry, expunge, replay, replay_event, replay_message
from outbox.endpoints import Endpoints
from tests.dispatching import fast_config
from tests.receiver import Receiver, Reply

PAYLOAD = {"email": "ada@example.com", "order": 42}


class Db:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def run(self, call: Any, **kwargs: Any) -> Any:
        with psycopg.connect(self.url) as conn:
            return call(conn, **kwargs)


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


async def deliver(db: Db) -> None:
    dispatcher = Dispatcher(db.url, fast_config(), log=NullLog())
    async with asyncio.timeout(30):
        await dispatcher.run(drain=True)


async def test_an_expunged_event_keeps_its_record_and_loses_its_payload(db: Db) -> None:
    with Receiver(lambda request: Reply(body=b"got ada@example.com")) as receiver:
        with psycopg.connect(db.url) as conn:
            Tenants().add(conn, "customer-17")
            sent = Endpoints().add(conn, url=receiver.url, tenant="customer-17").id
            waiting = Endpoints().add(conn, url=receiver.url + "/w", tenant="customer-17").id
            ids = Outbox().publish(
                conn, "order.paid", PAYLOAD, tenant="customer-17", idempotency_key="order-42"
            )
            Endpoints().disable(conn, waiting)  # its message waits, paused
        await deliver(db)
    before = db.query(
        "SELECT event_type, digest, message_ids FROM outbox.events WHERE event_key = 'order-42'"
    )

    done = db.run(expunge, event_key="order-42", tenant="customer-17")

    assert (done.messages, done.history, done.cancelled, done.running) == (1, 1, 1, 0)
    delivered = db.query(
        "SELECT id, endpoint_id, body, headers, last_status, expunged_at IS NOT NULL"
        " FROM outbox.delivered"
    )
    assert [row[:1] + row[2:] for row in delivered] == [
        (delivered[0][0], EXPUNGED_BODY, {}, 200, True)
    ]
    assert delivered[0][1] == sent
    hot = db.query(
        "SELECT state, last_error, body, expunged_at IS NOT NULL FROM outbox.messages"
        " WHERE endpoint_id = %s",
        waiting,
    )
    assert hot == [("dead", "expunged before delivery", EXPUNGED_BODY, True)]
    assert sorted(ids) == sorted([delivered[0][0], *db.query("SELECT id FROM outbox.messages")[0]])
    # the record stands: the event, its digest and ids; the attempt, without the answer
    after = db.query(
        "SELECT event_type, digest, message_ids FROM outbox.events WHERE event_key = 'order-42'"
    )
    assert after == before
    assert db.query("SELECT status, response_excerpt FROM outbox.attempts") == [(200, None)]
    recorded = db.query(
        "SELECT scope, selector, messages, history, cancelled, running FROM outbox.expunges"
    )
    assert recorded == [("event", {"event_key": "order-42", "tenant": "customer-17"}, 1, 1, 1, 0)]
    # nothing of the payload is left anywhere
    for table in ("messages", "delivered", "attempts", "events", "expunges"):
        dump = db.query(f"SELECT CAST(to_jsonb(t) AS text) FROM outbox.{table} AS t")
        assert all("ada@example.com" not in str(row) for row in dump), table

    # a replay of the event, to a new endpoint of the tenant, is refused with the reason
    with psycopg.connect(db.url) as conn:
        later = Endpoints().add(conn, url=receiver.url + "/later", tenant="customer-17").id
    with pytest.raises(InvalidArgument) as caught:
        db.run(replay_event, event_key="order-42", endpoint_id=later)
    assert caught.value.field == "event_key" and "expunged" in str(caught.value)
    # so is a replay of the delivered message, alone or in its window
    with pytest.raises(InvalidArgument) as caught:
        db.run(replay_message, message_id=delivered[0][0])
    assert caught.value.field == "message_id" and "expunged" in str(caught.value)
    since = datetime.now(UTC) - timedelta(hours=1)
    assert db.run(replay, endpoint_id=sent, since=since) == 0
    # and a retry of the cancelled one (it would send the marker)
    assert db.run(dead_retry, all_=True) == 0
    assert db.query("SELECT count(*) FROM outbox.messages WHERE state = 'dead'") == [(1,)]


def test_an_endpoints_messages_before_a_time_are_expunged_and_the_rest_kept(db: Db) -> None:
    with psycopg.connect(db.url) as conn:
        endpoint = Endpoints().add(conn, url="https://example.com/hook").id
        other = Endpoints().add(conn, url="https://example.com/other").id
        old = Outbox().publish(conn, "order.paid", PAYLOAD, idempotency_key="old")
        conn.execute(
            "UPDATE outbox.messages SET created_at = now() - interval '40 days' WHERE id = ANY(%s)",
            (old,),
        )
        new = Outbox().publish(conn, "order.paid", PAYLOAD, idempotency_key="new")
    cutoff = datetime.now(UTC) - timedelta(days=30)
    done = db.run(expunge, endpoint_id=endpoint, before=cutoff)
    assert (done.messages, done.cancelled, done.history) == (1, 1, 0)
    rows = db.query(
        "SELECT endpoint_id, idempotency_key, expunged_at IS NOT NULL"
        " FROM outbox.messages ORDER BY id"
    )
    assert rows == [
        (endpoint, f"old:{endpoint}", True),
        (other, f"old:{other}", False),
        (endpoint, f"new:{endpoint}", False),
        (other, f"new:{other}", False),
    ]
    assert len(new) == 2


def test_a_key_is_expunged_wherever_it_is_and_a_running_message_is_left_alone(db: Db) -> None:
    with psycopg.connect(db.url) as conn:
        box = Outbox()
        waiting = box.enqueue(conn, url="https://a.example/x", idempotency_key="k-1", json=PAYLOAD)
        running = box.enqueue(conn, url="https://b.example/x", idempotency_key="k-1", json=PAYLOAD)
        box.enqueue(conn, url="https://a.example/x", idempotency_key="k-2", json=PAYLOAD)
        conn.execute(
            "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'o',"
            " lease_until = now() + interval '1 minute' WHERE id = %s",
            (running,),
        )
    done = db.run(expunge, idempotency_key="k-1")
    assert (done.messages, done.cancelled, done.running) == (1, 1, 1)
    states = db.query("SELECT id, state, expunged_at IS NOT NULL FROM outbox.messages ORDER BY id")
    assert states[:2] == [(waiting, "dead", True), (running, "running", False)]
    assert states[2][1:] == ("ready", False)
    # once recorded, the same call finishes the work
    db.query("UPDATE outbox.messages SET state = 'dead', lease_owner = NULL WHERE id = %s", running)
    again = db.run(expunge, idempotency_key="k-1")
    assert (again.messages, again.cancelled, again.running) == (1, 0, 0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "event_key"),
        ({"event_key": "a", "idempotency_key": "b"}, "event_key"),
        ({"event_key": ""}, "event_key"),
        ({"event_key": "nope"}, "event_key"),  # no such event: refused, nothing recorded
        ({"event_key": "a", "tenant": "not a tenant"}, "tenant"),
        ({"idempotency_key": "k", "tenant": "customer-17"}, "tenant"),
        ({"endpoint_id": 1}, "before"),
        ({"endpoint_id": 1, "before": datetime(2026, 1, 1)}, "before"),  # naive
        ({"idempotency_key": "k", "before": datetime.now(UTC)}, "before"),
    ],
)
def test_bad_arguments_are_refused_naming_the_field_and_write_nothing(
    db: Db, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        db.run(expunge, **kwargs)
    assert caught.value.field == field
    assert db.query("SELECT count(*) FROM outbox.expunges") == [(0,)]


def test_the_command_asks_for_yes_expunges_and_prints_the_counts(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(db.url) as conn:
        Endpoints().add(conn, url="https://example.com/hook")
        Outbox().publish(conn, "order.paid", PAYLOAD, idempotency_key="order-42")
    argv = ["expunge", "--event", "order-42", "--database-url", db.url]
    assert main(argv) == 2  # no terminal to ask on, no --yes
    assert "without --yes" in capsys.readouterr().err
    assert db.query("SELECT count(*) FROM outbox.expunges") == [(0,)]
    assert main([*argv, "--yes", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["messages"], printed["cancelled"], printed["history"]) == (1, 1, 0)
    assert main(["expunge", "--key", "x", "--before", "1d", "--database-url", db.url]) == 2
    assert "--endpoint and --before go together" in capsys.readouterr().err
    assert main(["expunge", "--event", "nope", "--yes", "--database-url", db.url]) == 2
    assert "(--event)" in capsys.readouterr().err
