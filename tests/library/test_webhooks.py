"""Webhook endpoints, publish and signed delivery, against real PostgreSQL and a real
HTTP receiver on 127.0.0.1, with the dispatcher running in-process.

The state of the database is always read through fresh connections, so a check sees
only what was committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.pq import TransactionStatus
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from dispatchers.store.postgres import Store
from outbox import IdempotencyKeyReused, InvalidMessage, Outbox
from outbox.dsn import sqlalchemy_url
from outbox.endpoints import Endpoint, Endpoints
from outbox.receiver import verify
from outbox.secrets import GENERATED_KEY_BYTES, SECRET_PREFIX, generate_secret, parse_secret
from tests.dispatching import fast_config, running, wait_until
from tests.errors import invalid_argument
from tests.receiver import Received, Receiver, Reply

Conn = psycopg.Connection[tuple[Any, ...]]


class Db:
    """The test's database: every call runs (and commits) on a short-lived connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.box = Outbox()
        self.endpoints = Endpoints()

    def connect(self, **kwargs: Any) -> Conn:
        return psycopg.connect(self.url, **kwargs)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def count(self, table: str) -> int:
        return int(self.query(f"SELECT count(*) FROM outbox.{table}")[0][0])

    def add(self, url: str, **kwargs: Any) -> Endpoint:
        with self.connect() as conn:
            return self.endpoints.add(conn, url=url, **kwargs)

    def endpoint(self, endpoint_id: int) -> Endpoint:
        with self.connect() as conn:
            return self.endpoints.require(conn, endpoint_id)

    def disable(self, endpoint_id: int, **kwargs: Any) -> int:
        with self.connect() as conn:
            return self.endpoints.disable(conn, endpoint_id, **kwargs)

    def enable(self, endpoint_id: int) -> int:
        with self.connect() as conn:
            return self.endpoints.enable(conn, endpoint_id)

    def rotate(self, endpoint_id: int, **kwargs: Any) -> Endpoint:
        with self.connect() as conn:
            return self.endpoints.rotate_secret(conn, endpoint_id, **kwargs)

    def publish(
        self, event_type: str, payload: Any = None, *, box: Outbox | None = None, **kwargs: Any
    ) -> list[int]:
        with self.connect() as conn:
            return (box or self.box).publish(conn, event_type, payload, **kwargs)

    def state(self, message_id: int) -> str | None:
        rows = self.query("SELECT state FROM outbox.messages WHERE id = %s", message_id)
        return rows[0][0] if rows else None

    def states(self) -> dict[int, str]:
        return dict(self.query("SELECT id, state FROM outbox.messages"))


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


async def drain(db: Db, cfg: DispatcherConfig | None = None) -> Dispatcher:
    """Run a dispatcher until nothing is due or running."""
    dispatcher = Dispatcher(db.url, cfg or fast_config(), log=NullLog())
    async with asyncio.timeout(20):
        await dispatcher.run(drain=True)
    return dispatcher


async def claimed_past(db: Db, ids: list[int]) -> None:
    """Return once a running dispatcher has delivered a message due no earlier than
    any of ``ids``, and check that none of them was claimed meanwhile. A claim
    takes due messages in (available_at, id) order, so one of ``ids`` that could be
    claimed would have been, at the latest with that message."""

    def rows() -> list[tuple[Any, ...]]:
        return db.query(
            "SELECT id, state, attempts, available_at FROM outbox.messages"
            " WHERE id = ANY(%s) ORDER BY id",
            ids,
        )

    before = rows()
    due = max([row[3] for row in before] + [datetime.now(UTC)])
    with Receiver() as probe:
        with db.connect() as conn:
            later = db.box.enqueue(
                conn, url=probe.url, idempotency_key=f"probe-{due}", json={}, available_at=due
            )
        await wait_until(
            lambda: bool(db.query("SELECT 1 FROM outbox.delivered WHERE id = %s", later))
        )
    assert rows() == before


def data_of(request: Received) -> Any:
    return json.loads(request.body)["data"]


# -- the Endpoints API ---------------------------------------------------------------


def test_add_generates_a_whsec_secret_unless_one_is_given(db: Db) -> None:
    generated = db.add("https://example.com/a")
    (secret,) = generated.secrets
    assert secret.secret.startswith(SECRET_PREFIX)
    assert len(parse_secret(secret.secret)) == GENERATED_KEY_BYTES
    assert secret.expires_at is None
    assert generated.enabled
    assert generated.failure_streak == 0
    assert generated.event_types == []

    other = db.add("https://example.com/b")
    assert other.secrets[0].secret != secret.secret

    mine = generate_secret()
    given = db.add("https://example.com/c", secret=mine)
    assert [s.secret for s in given.secrets] == [mine]
    assert db.endpoint(given.id).secrets[0].secret == mine


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("secret", {"secret": "not-a-secret"}),
        ("secret", {"secret": "whsec_" + "A" * 8}),  # 6 bytes: too short
        ("url", {"url": "ftp://example.com/x"}),
        ("event_types", {"event_types": ["order created"]}),
        ("event_types", {"event_types": ["order.*.*"]}),
        ("metadata", {"metadata": {"x": object()}}),
    ],
)
def test_add_refuses_a_malformed_field_and_writes_nothing(
    db: Db, field: str, kwargs: dict[str, Any]
) -> None:
    arguments: dict[str, Any] = {"url": "https://example.com/hook"} | kwargs
    with db.connect() as conn:
        with pytest.raises(InvalidMessage) as caught:
            db.endpoints.add(conn, **arguments)
        # refused before any statement: the caller's transaction was never started
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert caught.value.field == field
    assert str(caught.value).startswith(field + ":")
    if field == "secret":
        assert kwargs["secret"] not in str(caught.value)
    assert db.count("endpoints") == 0


def test_get_all_and_delete(db: Db) -> None:
    first = db.add(
        "https://example.com/1",
        event_types=["order.*", "invoice.paid", "order.*"],
        description="orders",
        metadata={"team": "billing"},
        max_concurrency=4,
    )
    second = db.add("https://example.com/2")
    assert first.event_types == ["order.*", "invoice.paid"]  # duplicates dropped
    with db.connect() as conn:
        got = db.endpoints.get(conn, first.id)
        assert got == first
        assert got is not None
        assert (got.url, got.description, got.metadata, got.max_concurrency) == (
            "https://example.com/1",
            "orders",
            {"team": "billing"},
            4,
        )
        assert db.endpoints.get(conn, 999_999) is None
        assert [e.id for e in db.endpoints.all(conn)] == [first.id, second.id]
        with invalid_argument("endpoint_id"):
            db.endpoints.require(conn, 999_999)
    with db.connect() as conn:
        assert db.endpoints.delete(conn, first.id) == 0
    with db.connect() as conn:
        assert db.endpoints.get(conn, first.id) is None
        assert [e.id for e in db.endpoints.all(conn)] == [second.id]
        with invalid_argument("endpoint_id"):
            db.endpoints.delete(conn, first.id)


UPDATES: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"url": "https://example.org/new"}, {"url": "https://example.org/new"}),
    ({"event_types": ["invoice.*"]}, {"event_types": ["invoice.*"]}),
    ({"event_types": []}, {"event_types": []}),
    ({"description": "renamed"}, {"description": "renamed"}),
    ({"metadata": {"team": "ops"}}, {"metadata": {"team": "ops"}}),
    ({"max_concurrency": 9}, {"max_concurrency": 9}),
    ({"clear_max_concurrency": True}, {"max_concurrency": None}),
    ({}, {}),
]


def test_update_changes_the_given_field_and_keeps_the_others(db: Db) -> None:
    fields = ("url", "event_types", "description", "metadata", "max_concurrency", "secrets")
    for change, expected in UPDATES:
        before = db.add(
            "https://example.com/old",
            event_types=["order.*"],
            description="orders",
            metadata={"team": "billing"},
            max_concurrency=4,
        )
        with db.connect() as conn:
            returned = db.endpoints.update(conn, before.id, **change)
        after = db.endpoint(before.id)
        assert returned == after, change
        for name in fields:
            want = expected.get(name, getattr(before, name))
            assert getattr(after, name) == want, (change, name)
        assert after.updated_at >= before.updated_at


def test_update_refuses_bad_input_and_unknown_ids(db: Db) -> None:
    endpoint = db.add("https://example.com/x", event_types=["order.*"])
    with db.connect() as conn:
        with pytest.raises(InvalidMessage, match=r"^url:"):
            db.endpoints.update(conn, endpoint.id, url="gopher://example.com")
        with pytest.raises(InvalidMessage, match=r"^event_types:"):
            db.endpoints.update(conn, endpoint.id, event_types=["bad type"])
        assert conn.info.transaction_status == TransactionStatus.IDLE
        with invalid_argument("endpoint_id"):
            db.endpoints.update(conn, 999_999, description="x")
    assert db.endpoint(endpoint.id) == endpoint


def test_as_dict_masks_secrets_unless_asked(db: Db) -> None:
    endpoint = db.endpoint(db.add("https://example.com/x").id)
    secret = endpoint.secrets[0].secret
    masked = endpoint.as_dict()
    # JSON-friendly: only times need an encoder
    assert secret not in json.dumps(masked, default=datetime.isoformat)
    assert masked["secrets"][0]["secret"] != secret
    assert masked["url"] == "https://example.com/x"
    shown = endpoint.as_dict(show_secrets=True)
    assert shown["secrets"] == [{"secret": secret, "expires_at": None, "key_id": None}]
    assert secret not in repr(endpoint)


@pytest.mark.parametrize("waiting", ["ready", "paused"])
async def test_delete_makes_waiting_messages_dead_and_keeps_their_url(
    db: Db, receiver: Receiver, waiting: str
) -> None:
    url = receiver.url + "/hooks"
    endpoint = db.add(url)
    (delivered,) = db.publish("order.created", {"n": 0})
    await drain(db)
    ids = db.publish("order.created", {"n": 1}) + db.publish("order.created", {"n": 2})
    if waiting == "paused":
        assert db.disable(endpoint.id) == 2
    assert {db.state(i) for i in ids} == {waiting}

    with db.connect() as conn:
        assert db.endpoints.delete(conn, endpoint.id) == 2

    rows = db.query(
        "SELECT id, state, last_error, url, endpoint_id, completed_at IS NOT NULL"
        " FROM outbox.messages ORDER BY id"
    )
    assert rows == [(i, "dead", "endpoint deleted", url, None, True) for i in ids]
    # delivered history is kept as it was
    assert db.query("SELECT id, endpoint_id FROM outbox.delivered") == [(delivered, endpoint.id)]
    await drain(db)
    assert len(receiver.requests) == 1


# -- publish ---------------------------------------------------------------------------


def test_publish_makes_one_message_per_enabled_subscribed_endpoint(db: Db) -> None:
    exact = db.add("https://example.com/exact", event_types=["order.created"])
    prefix = db.add("https://example.com/prefix", event_types=["order.*"])
    everything = db.add("https://example.com/all")
    other = db.add("https://example.com/other", event_types=["invoice.*", "order.deleted"])
    disabled = db.add("https://example.com/off", event_types=["order.created"])
    db.disable(disabled.id)

    ids = db.publish("order.created", {"n": 1}, idempotency_key="evt-1")
    rows = db.query("SELECT id, endpoint_id FROM outbox.messages ORDER BY id")
    assert ids == [r[0] for r in rows]
    assert sorted(r[1] for r in rows) == [exact.id, prefix.id, everything.id]

    # "order.*" matches below "order." only; the catch-all takes everything
    assert _targets(db, db.publish("order", {})) == [everything.id]
    assert _targets(db, db.publish("orders.created", {})) == [everything.id]
    assert _targets(db, db.publish("order.deleted", {})) == sorted(
        [prefix.id, everything.id, other.id]
    )
    assert _targets(db, db.publish("order.line.added", {})) == sorted([prefix.id, everything.id])
    assert db.query("SELECT count(*) FROM outbox.messages WHERE endpoint_id = %s", other.id) == [
        (1,)
    ]
    assert db.query("SELECT count(*) FROM outbox.messages WHERE endpoint_id = %s", disabled.id) == [
        (0,)
    ]


def _targets(db: Db, ids: list[int]) -> list[int]:
    rows = db.query(
        "SELECT endpoint_id FROM outbox.messages WHERE id = ANY(%s) ORDER BY endpoint_id", ids
    )
    return [r[0] for r in rows]


def test_publish_writes_the_envelope_keyed_per_endpoint(db: Db) -> None:
    endpoint = db.add("https://example.com/hook")
    before = datetime.now(UTC)
    (mid,) = db.publish("order.created", {"total": 10, "note": "é"}, idempotency_key="evt-1")
    after = datetime.now(UTC)
    ((key, target, url, method, content_type, event_type, body, state, max_attempts),) = db.query(
        "SELECT idempotency_key, target, url, method, content_type, event_type, body,"
        " state, max_attempts FROM outbox.messages WHERE id = %s",
        mid,
    )
    assert key == f"evt-1:{endpoint.id}"
    assert target == f"endpoint:{endpoint.id}"
    assert url is None  # the endpoint's current URL is used at each attempt
    assert (method, content_type, event_type, state) == (
        "POST",
        "application/json",
        "order.created",
        "ready",
    )
    assert max_attempts == 8  # an attempt, and the Standard Webhooks schedule's 7 retries
    envelope = json.loads(bytes(body))
    assert set(envelope) == {"type", "timestamp", "data"}
    assert envelope["type"] == "order.created"
    assert envelope["data"] == {"total": 10, "note": "é"}
    stamp = datetime.fromisoformat(envelope["timestamp"])
    assert before - timedelta(milliseconds=1) <= stamp <= after
    assert db.query("SELECT target, idempotency_key, message_id FROM outbox.message_keys") == [
        (target, key, mid)
    ]


async def test_publishing_the_same_key_again_writes_nothing(db: Db, receiver: Receiver) -> None:
    one = db.add(receiver.url + "/1")
    two = db.add(receiver.url + "/2")
    ids = db.publish("order.created", {"n": 1}, idempotency_key="evt-1")
    assert len(ids) == 2
    assert db.publish("order.created", {"n": 1}, idempotency_key="evt-1") == ids
    with db.connect() as conn:  # twice in one transaction, too
        assert db.box.publish(conn, "order.created", {"n": 1}, idempotency_key="evt-1") == ids
        assert db.box.publish(conn, "order.created", {"n": 1}, idempotency_key="evt-1") == ids
    assert db.count("messages") == 2
    assert db.count("message_keys") == 2

    await drain(db)  # delivered: the messages leave the hot table, their keys stay
    # an endpoint subscribed since gets nothing: the event was published once
    db.add(receiver.url + "/3")
    assert db.publish("order.created", {"n": 1}, idempotency_key="evt-1") == ids
    assert db.count("messages") == 0
    assert db.count("message_keys") == 2
    await drain(db)
    assert sorted(r.path for r in receiver.requests) == ["/1", "/2"]
    assert [data_of(r) for r in receiver.requests] == [{"n": 1}, {"n": 1}]
    assert {r.headers["webhook-id"] for r in receiver.requests} == {
        f"evt-1:{one.id}",
        f"evt-1:{two.id}",
    }


def test_publishing_a_key_again_with_another_event_raises_and_writes_nothing(db: Db) -> None:
    db.add("https://example.com/1")
    ids = db.publish("order.created", {"n": 1, "items": ["a"]}, idempotency_key="evt-1")
    with db.connect() as conn:
        for event_type, payload in [
            ("order.created", {"n": 2, "items": ["a"]}),
            ("order.created", {"items": ["a"], "n": 1}),  # another body is sent
            ("order.updated", {"n": 1, "items": ["a"]}),
        ]:
            with pytest.raises(IdempotencyKeyReused) as raised:
                db.box.publish(conn, event_type, payload, idempotency_key="evt-1")
            assert (raised.value.key, raised.value.message_id) == ("evt-1", None)
            assert str(raised.value) == (
                "idempotency_key: event 'evt-1' was published before with another event type"
                " or payload; a new event needs a new key"
            )
        # nothing was written, and the transaction goes on
        assert db.box.publish(conn, "order.created", {"n": 1}, idempotency_key="evt-2")
        conn.commit()
    assert db.count("messages") == 2
    assert db.query("SELECT event_key, message_ids FROM outbox.events ORDER BY 1")[0] == (
        "evt-1",
        ids,
    )


@pytest.mark.parametrize("payload", [{}, {"n": 2}])  # the same event, or another
@pytest.mark.parametrize("second", ["psycopg", "sqlalchemy"])
def test_concurrent_publishes_of_one_key_return_the_same_ids(
    db: Db, second: str, payload: dict[str, int]
) -> None:
    db.add("https://example.com/1")
    db.add("https://example.com/2")

    def publish_again() -> list[int]:
        if second == "psycopg":
            return db.publish("order.created", payload, idempotency_key="evt-race")
        engine = create_engine(sqlalchemy_url(db.url))
        try:
            with Session(engine) as session, session.begin():
                return db.box.publish(session, "order.created", payload, idempotency_key="evt-race")
        finally:
            engine.dispose()

    with db.connect() as first, ThreadPoolExecutor(1) as pool:
        ids = db.box.publish(first, "order.created", {}, idempotency_key="evt-race")
        # the second transaction waits on the first one's event...
        racing = pool.submit(publish_again)
        deadline = time.monotonic() + 30
        while not _waiting_on_a_lock(db):
            assert not racing.done(), racing.result()  # it must wait, not finish
            assert time.monotonic() < deadline, "the second publish never waited on a lock"
            time.sleep(0.02)
        assert not racing.done()
        first.commit()
        # ...and then finds it, although its statement began before it committed
        if payload:
            with pytest.raises(IdempotencyKeyReused, match="'evt-race'"):
                racing.result(timeout=5)
        else:
            assert racing.result(timeout=5) == ids
    assert db.count("messages") == 2


def _waiting_on_a_lock(db: Db) -> bool:
    rows = db.query(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return bool(rows[0][0])


def test_publish_without_a_key_writes_new_messages_each_time(db: Db) -> None:
    endpoint = db.add("https://example.com/hook")
    first = db.publish("order.created", {"n": 1})
    second = db.publish("order.created", {"n": 1})
    assert len(first) == len(second) == 1
    assert first != second
    keys = [r[0] for r in db.query("SELECT idempotency_key FROM outbox.messages ORDER BY id")]
    assert len(set(keys)) == 2
    assert all(k.endswith(f":{endpoint.id}") for k in keys)


def test_publish_is_rolled_back_with_the_transaction(db: Db) -> None:
    db.add("https://example.com/hook")
    with db.connect() as conn:
        assert len(db.box.publish(conn, "order.created", {}, idempotency_key="evt-1")) == 1
        conn.rollback()
    assert db.count("messages") == 0
    assert db.count("message_keys") == 0
    assert len(db.publish("order.created", {}, idempotency_key="evt-1")) == 1


def test_publish_with_no_endpoint_writes_nothing(db: Db) -> None:
    assert db.publish("order.created", {"n": 1}) == []
    assert db.count("messages") == 0


@pytest.mark.parametrize(
    ("field", "event_type", "payload", "kwargs"),
    [
        ("event_type", "", {}, {}),
        ("event_type", " ", {}, {}),
        ("event_type", "x" * 256, {}, {}),
        ("event_type", "order.*", {}, {}),
        ("event_type", "*", {}, {}),
        ("event_type", "outbox.message.dead", {}, {}),  # the outbox's own (its alerts)
        ("payload", "order.created", {"when": object()}, {}),
        ("payload", "order.created", {"x": float("nan")}, {}),
        ("payload", "order.created", "x" * 300_000, {}),
        ("idempotency_key", "order.created", {}, {"idempotency_key": "k" * 201}),
    ],
)
def test_publish_refuses_bad_input_naming_the_field_and_writes_nothing(
    db: Db, field: str, event_type: Any, payload: Any, kwargs: dict[str, Any]
) -> None:
    db.add("https://example.com/hook")
    with db.connect() as conn:
        with pytest.raises(InvalidMessage) as caught:
            db.box.publish(conn, event_type, payload, **kwargs)
        assert conn.info.transaction_status == TransactionStatus.IDLE
    assert caught.value.field == field
    assert str(caught.value).startswith(field + ":")
    assert db.count("messages") == 0


@pytest.mark.parametrize("kind", ["psycopg-async-connection", "sqlalchemy-async-session"])
async def test_publish_async(db: Db, kind: str) -> None:
    endpoint = db.add("https://example.com/hook", event_types=["order.*"])
    async with contextlib.AsyncExitStack() as stack:
        if kind == "psycopg-async-connection":
            aconn = await psycopg.AsyncConnection.connect(db.url)
            stack.push_async_callback(aconn.close)
            tx: Any = aconn
        else:
            engine = create_async_engine(sqlalchemy_url(db.url))
            stack.push_async_callback(engine.dispose)
            tx = AsyncSession(engine)
            stack.push_async_callback(tx.close)
        ids = await db.box.publish_async(tx, "order.created", {"n": 1}, idempotency_key="evt-a")
        assert len(ids) == 1
        again = await db.box.publish_async(tx, "order.created", {"n": 1}, idempotency_key="evt-a")
        assert again == ids
        with pytest.raises(IdempotencyKeyReused, match="'evt-a'"):
            await db.box.publish_async(tx, "order.created", {"n": 2}, idempotency_key="evt-a")
        assert await db.box.publish_async(tx, "invoice.paid", {}) == []
        assert db.count("messages") == 0  # not committed yet
        with pytest.raises(InvalidMessage, match=r"^event_type:"):
            await db.box.publish_async(tx, "bad type", {})
        await tx.commit()
    assert db.query("SELECT id, endpoint_id, idempotency_key FROM outbox.messages") == [
        (ids[0], endpoint.id, f"evt-a:{endpoint.id}")
    ]


@pytest.mark.parametrize("notify", [True, False])
def test_publish_notifies_once_per_transaction(db: Db, notify: bool) -> None:
    db.add("https://example.com/1")
    db.add("https://example.com/2")
    box = Outbox(notify=notify)
    with db.connect(autocommit=True) as listener:
        listener.execute("LISTEN outbox_ready")
        # a dispatcher waiting for work holds the wake lock: only then do producers notify
        listener.execute("SELECT pg_advisory_lock(%s, %s)", box.queries.wake_lock)
        with db.connect() as conn:
            box.publish(conn, "order.created", {"n": 1})
            box.publish(conn, "order.updated", {"n": 2})
            box.publish(conn, "order.updated", {"n": 2}, idempotency_key="evt-1")
            box.publish(conn, "order.updated", {"n": 2}, idempotency_key="evt-1")
        received = list(listener.notifies(timeout=0.5))
    assert db.count("messages") == 6
    if notify:
        assert [(n.channel, n.payload) for n in received] == [("outbox_ready", "")]
    else:
        assert received == []


# -- signed delivery ---------------------------------------------------------------------


async def test_deliveries_verify_with_the_reference_implementation_and_keep_their_id(
    db: Db, receiver: Receiver
) -> None:
    sent_at: list[float] = []
    replies = iter([Reply(status=500)])

    def respond(req: Received) -> Reply:
        sent_at.append(time.time())
        return next(replies, Reply())

    receiver.responder = respond
    endpoint = db.add(receiver.url + "/hooks")
    secret = endpoint.secrets[0].secret
    (mid,) = db.publish("order.created", {"total": 10}, idempotency_key="evt-1")
    async with running(db):
        await wait_until(lambda: db.count("delivered") == 1)

    first, second = receiver.requests
    for request, arrived in zip(receiver.requests, sent_at, strict=True):
        assert request.path == "/hooks"
        payload = Webhook(secret).verify(request.body, request.headers)
        assert payload["type"] == "order.created"
        assert payload["data"] == {"total": 10}
        verify(secret, request.headers, request.body)
        assert request.headers["webhook-id"] == f"evt-1:{endpoint.id}"
        assert request.headers["idempotency-key"] == f'"evt-1:{endpoint.id}"'
        assert request.headers["content-type"] == "application/json"
        # signed at the attempt, not at publish
        assert abs(int(request.headers["webhook-timestamp"]) - arrived) <= 2
        assert len(request.headers["webhook-signature"].split(" ")) == 1
    assert first.body == second.body
    assert db.query("SELECT attempt, outcome, status FROM outbox.attempts ORDER BY attempt") == [
        (1, "retry", 500),
        (2, "delivered", 200),
    ]
    assert db.query("SELECT id, attempts FROM outbox.delivered") == [(mid, 2)]


async def test_a_request_signed_with_another_secret_fails_verification(
    db: Db, receiver: Receiver
) -> None:
    secret = db.add(receiver.url).secrets[0].secret
    db.publish("order.created", {})
    await drain(db)
    (request,) = receiver.requests
    Webhook(secret).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(request.body, request.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(request.body + b" ", request.headers)


async def test_during_rotation_old_and_new_secrets_both_sign(db: Db, receiver: Receiver) -> None:
    endpoint = db.add(receiver.url)
    old = endpoint.secrets[0].secret
    before = datetime.now(UTC)
    rotated = db.rotate(endpoint.id)
    new = rotated.secrets[0].secret
    assert new != old
    assert [s.secret for s in rotated.secrets] == [new, old]
    assert rotated.secrets[0].expires_at is None
    expires_at = rotated.secrets[1].expires_at
    assert expires_at is not None
    assert (
        before + timedelta(hours=23, minutes=59)
        < expires_at
        < before + timedelta(hours=24, minutes=1)
    )
    assert rotated.active_secrets(datetime.now(UTC)) == [new, old]

    db.publish("order.created", {"n": 1})
    await drain(db)
    (request,) = receiver.requests
    signatures = request.headers["webhook-signature"].split(" ")
    assert len(signatures) == 2
    assert all(s.startswith("v1,") for s in signatures)
    for secret in (old, new):  # a receiver holding either one accepts it
        assert Webhook(secret).verify(request.body, request.headers)["data"] == {"n": 1}
        verify(secret, request.headers, request.body)


@pytest.mark.parametrize("how", ["no-overlap", "expired"])
async def test_after_the_overlap_only_the_new_secret_signs(
    db: Db, receiver: Receiver, how: str
) -> None:
    endpoint = db.add(receiver.url)
    old = endpoint.secrets[0].secret
    if how == "no-overlap":
        new = db.rotate(endpoint.id, overlap=timedelta(0)).secrets[0].secret
    else:
        new = db.rotate(endpoint.id).secrets[0].secret
        db.query(
            "UPDATE outbox.endpoint_secrets SET expires_at = now() - interval '1 second'"
            " WHERE endpoint_id = %s AND expires_at IS NOT NULL RETURNING id",
            endpoint.id,
        )
    assert db.endpoint(endpoint.id).active_secrets(datetime.now(UTC)) == [new]

    db.publish("order.created", {"n": 1})
    await drain(db)
    (request,) = receiver.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 1
    assert Webhook(new).verify(request.body, request.headers)["data"] == {"n": 1}
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(request.body, request.headers)


def test_a_second_rotation_keeps_every_secret_still_in_force(db: Db) -> None:
    endpoint = db.add("https://example.com/x")
    first = endpoint.secrets[0].secret
    second_rotation = db.rotate(endpoint.id, overlap=timedelta(hours=1))
    second = second_rotation.secrets[0].secret
    expiry = second_rotation.secrets[1].expires_at
    third = generate_secret()
    rotated = db.rotate(endpoint.id, secret=third, overlap=timedelta(hours=24))
    assert [s.secret for s in rotated.secrets] == [third, second, first]
    # the older secret keeps its own deadline; the one just replaced gets the new overlap
    assert rotated.secrets[2].expires_at == expiry
    assert expiry is not None
    second_expiry = rotated.secrets[1].expires_at
    assert second_expiry is not None
    assert second_expiry > expiry + timedelta(hours=22)
    now = datetime.now(UTC)
    assert rotated.active_secrets(now) == [third, second, first]
    assert rotated.active_secrets(now + timedelta(hours=2)) == [third, second]


async def test_messages_go_to_the_endpoint_url_current_at_each_attempt(
    db: Db, receiver: Receiver
) -> None:
    endpoint = db.add(receiver.url + "/old")
    db.publish("order.created", {"n": 1})
    with db.connect() as conn:
        db.endpoints.update(conn, endpoint.id, url=receiver.url + "/new")
    await drain(db)
    assert [r.path for r in receiver.requests] == ["/new"]
    assert db.query("SELECT url FROM outbox.delivered") == [(None,)]


def test_rotate_refuses_a_bad_secret_or_overlap(db: Db) -> None:
    endpoint = db.add("https://example.com/x")
    with db.connect() as conn:
        with pytest.raises(InvalidMessage, match=r"^secret:"):
            db.endpoints.rotate_secret(conn, endpoint.id, secret="whsec_short")
        with invalid_argument("overlap"):
            db.endpoints.rotate_secret(conn, endpoint.id, overlap=timedelta(seconds=-1))
        with invalid_argument("endpoint_id"):
            db.endpoints.rotate_secret(conn, 999_999)
    assert db.endpoint(endpoint.id).secrets == endpoint.secrets


# -- endpoint health -------------------------------------------------------------------------


async def test_410_disables_the_endpoint_and_pauses_its_other_messages(
    db: Db, receiver: Receiver
) -> None:
    receiver.responder = lambda req: Reply(status=410)
    endpoint = db.add(receiver.url)
    # one ordering key: the later two wait for the first, so only it is sent
    gone, *waiting = (
        db.publish("order.created", {"n": n}, ordering_key="acct")[0] for n in range(3)
    )
    await drain(db)

    assert [data_of(r) for r in receiver.requests] == [{"n": 0}]
    assert db.query("SELECT id, state, attempts, last_status FROM outbox.messages ORDER BY id") == [
        (gone, "dead", 1, 410)
    ] + [(i, "paused", 0, None) for i in waiting]
    disabled = db.endpoint(endpoint.id)
    assert not disabled.enabled
    assert disabled.disabled_reason is not None
    assert "410" in disabled.disabled_reason
    assert disabled.disabled_at is not None
    assert db.query("SELECT outcome, status FROM outbox.attempts") == [("gone", 410)]

    assert db.publish("order.created", {"n": 3}) == []  # a disabled endpoint gets nothing

    receiver.responder = lambda req: Reply()
    assert db.enable(endpoint.id) == 2
    assert [db.state(i) for i in waiting] == ["ready", "ready"]
    enabled = db.endpoint(endpoint.id)
    assert (enabled.enabled, enabled.disabled_reason, enabled.disabled_at) == (True, None, None)
    await drain(db)
    assert [data_of(r) for r in receiver.requests] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert sorted(r[0] for r in db.query("SELECT id FROM outbox.delivered")) == waiting


@pytest.mark.slow
async def test_failure_streak_grows_with_failures_and_resets_on_success(
    db: Db, receiver: Receiver
) -> None:
    receiver.responder = lambda req: Reply(status=503)
    endpoint = db.add(receiver.url)
    assert (endpoint.failure_streak, endpoint.failing_since, endpoint.last_success_at) == (
        0,
        None,
        None,
    )
    started = datetime.now(UTC)
    (failing,) = db.publish("order.created", {}, box=Outbox(webhook_max_attempts=3))
    async with running(db):  # a drain would stop while a retry is scheduled
        await wait_until(lambda: db.state(failing) == "dead")
    assert db.state(failing) == "dead"
    after_failures = db.endpoint(endpoint.id)
    assert after_failures.failure_streak == 3
    assert after_failures.failing_since is not None
    assert started <= after_failures.failing_since <= datetime.now(UTC)
    assert after_failures.last_success_at is None
    assert after_failures.enabled  # far from the default disable_after

    receiver.responder = lambda req: Reply(status=400)  # a permanent failure counts too
    db.publish("order.created", {})
    await drain(db)
    assert db.endpoint(endpoint.id).failure_streak == 4
    assert db.endpoint(endpoint.id).failing_since == after_failures.failing_since

    receiver.responder = lambda req: Reply()
    db.publish("order.created", {})
    await drain(db)
    healed = db.endpoint(endpoint.id)
    assert (healed.failure_streak, healed.failing_since) == (0, None)
    assert healed.last_success_at is not None
    assert healed.last_success_at >= after_failures.failing_since
    assert healed.enabled


@pytest.mark.slow
async def test_an_endpoint_failing_longer_than_disable_after_is_disabled(
    db: Db, receiver: Receiver
) -> None:
    receiver.responder = lambda req: Reply(status=503)
    endpoint = db.add(receiver.url)
    box = Outbox(webhook_max_attempts=200)
    ids = [db.publish("order.created", {"n": n}, box=box)[0] for n in range(3)]
    async with running(db, fast_config(disable_after=0.5)):
        await wait_until(lambda: not db.endpoint(endpoint.id).enabled)
        await wait_until(lambda: set(db.states().values()) == {"paused"}, seconds=5)
        sent = len(receiver.requests)
        await claimed_past(db, ids)  # paused messages are not attempted
        assert len(receiver.requests) == sent
    disabled = db.endpoint(endpoint.id)
    assert disabled.disabled_reason is not None
    assert "failed since" in disabled.disabled_reason
    assert disabled.failing_since is not None
    assert disabled.disabled_at is not None
    assert disabled.disabled_at - disabled.failing_since > timedelta(seconds=0.5)
    assert disabled.failure_streak >= 2
    assert sorted(db.states()) == ids
    assert db.publish("order.created", {}) == []
    assert db.enable(endpoint.id) == len(ids)
    healed = db.endpoint(endpoint.id)
    assert (healed.enabled, healed.failure_streak, healed.failing_since) == (True, 0, None)


@pytest.mark.slow
async def test_operator_disable_pauses_messages_and_claim_skips_later_commits(
    db: Db, receiver: Receiver
) -> None:
    endpoint = db.add(receiver.url)
    (waiting,) = db.publish("order.created", {"n": 1})
    with db.connect() as late:
        # published before the disable, committed after it
        (committed_late,) = db.box.publish(late, "order.created", {"n": 2})
        assert db.disable(endpoint.id) == 1
        late.commit()
    assert db.states() == {waiting: "paused", committed_late: "ready"}
    disabled = db.endpoint(endpoint.id)
    assert (disabled.enabled, disabled.disabled_reason) == (False, "disabled by an operator")

    store = Store(db.url, fast_config())
    await store.open()
    try:
        assert (await store.claim("owner-x", 10)).messages == []
    finally:
        await store.close()
    async with running(db):
        await claimed_past(db, [waiting, committed_late])
    assert receiver.requests == []
    assert db.query("SELECT count(*) FROM outbox.messages WHERE attempts > 0") == [(0,)]

    assert db.enable(endpoint.id) == 1
    await drain(db)
    assert sorted(data_of(r)["n"] for r in receiver.requests) == [1, 2]
    assert db.count("messages") == 0


@pytest.mark.slow
async def test_a_paused_message_holds_its_ordering_key(db: Db, receiver: Receiver) -> None:
    endpoint = db.add(receiver.url + "/hooks")
    (paused,) = db.publish("order.created", {"n": 1}, ordering_key="acct")
    assert db.disable(endpoint.id) == 1
    with db.connect() as conn:  # the same key, to a destination that works
        later = db.box.enqueue(
            conn,
            url=receiver.url + "/direct",
            idempotency_key="after-the-paused-one",
            json={"n": 2},
            ordering_key="acct",
        )
    async with running(db):
        await claimed_past(db, [later])
        assert receiver.requests == []
        assert db.states() == {paused: "paused", later: "ready"}
        assert db.enable(endpoint.id) == 1
        await wait_until(lambda: db.count("messages") == 0)
    assert [r.path for r in receiver.requests] == ["/hooks", "/direct"]


def test_disable_and_enable_refuse_unknown_ids_and_bad_reasons(db: Db) -> None:
    endpoint = db.add("https://example.com/x")
    with db.connect() as conn:
        with invalid_argument("endpoint_id"):
            db.endpoints.disable(conn, 999_999)
        with invalid_argument("endpoint_id"):
            db.endpoints.enable(conn, 999_999)
        with pytest.raises(InvalidMessage, match=r"^reason:"):
            db.endpoints.disable(conn, endpoint.id, reason="")
    assert db.disable(endpoint.id, reason="maintenance") == 0
    assert db.endpoint(endpoint.id).disabled_reason == "maintenance"


async def test_a_retry_that_returns_after_its_endpoint_was_disabled_is_paused(
    db: Db, receiver: Receiver
) -> None:
    endpoint = db.add(receiver.url)
    disabled_once = threading.Event()

    def respond(req: Received) -> Reply:
        if not disabled_once.is_set():
            disabled_once.set()
            db.disable(endpoint.id, reason="paused for maintenance")  # while in flight
            return Reply(status=500)
        return Reply()

    receiver.responder = respond
    (mid,) = db.publish("order.created", {"n": 1})
    await drain(db)
    assert db.query(
        "SELECT state, attempts, last_status, lease_owner FROM outbox.messages WHERE id = %s", mid
    ) == [("paused", 1, 500, None)]
    assert len(receiver.requests) == 1
    disabled = db.endpoint(endpoint.id)
    assert (disabled.enabled, disabled.disabled_reason) == (False, "paused for maintenance")

    assert db.enable(endpoint.id) == 1
    await drain(db)
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert db.query("SELECT id, attempts FROM outbox.delivered") == [(mid, 2)]


@pytest.mark.slow
async def test_a_retry_that_returns_after_its_endpoint_was_deleted_is_dead(
    db: Db, receiver: Receiver
) -> None:
    endpoint = db.add(receiver.url + "/hooks")

    def respond(req: Received) -> Reply:
        if len(receiver.requests) == 1:
            with db.connect() as conn:  # while the first attempt is in flight
                db.endpoints.delete(conn, endpoint.id)
            return Reply(status=500)
        return Reply()

    receiver.responder = respond
    (mid,) = db.publish("order.created", {"n": 1})
    async with running(db):
        await wait_until(lambda: db.state(mid) != "running" and len(receiver.requests) >= 1)
        await claimed_past(db, [mid])  # a retry would have been claimed by now
    # not sent again, and certainly not unsigned to the deleted endpoint's URL
    assert len(receiver.requests) == 1
    assert db.query(
        "SELECT state, attempts, last_status, last_error, url, endpoint_id"
        " FROM outbox.messages WHERE id = %s",
        mid,
    ) == [("dead", 1, 500, "endpoint deleted", receiver.url + "/hooks", None)]


async def test_a_rescued_message_whose_endpoint_was_deleted_is_dead(db: Db) -> None:
    endpoint = db.add("https://example.com/hooks")
    (mid,) = db.publish("order.created", {"n": 1})
    store = Store(db.url, fast_config())
    await store.open()
    try:
        (job,) = (await store.claim("frozen-owner", 1)).messages
        assert job.secrets  # a webhook: signed when sent
        with db.connect() as conn:
            assert db.endpoints.delete(conn, endpoint.id) == 1
        db.query(
            "UPDATE outbox.messages SET lease_until = now() - interval '1 second'"
            " WHERE id = %s RETURNING id",
            mid,
        )
        assert await store.rescue() == [(mid, "dead")]
        assert (await store.claim("owner-b", 10)).messages == []
    finally:
        await store.close()
    assert db.query(
        "SELECT state, last_error, url, endpoint_id FROM outbox.messages WHERE id = %s", mid
    ) == [("dead", "endpoint deleted", "https://example.com/hooks", None)]


async def test_drain_finishes_when_only_a_disabled_endpoint_has_ready_messages(
    db: Db, receiver: Receiver
) -> None:
    endpoint = db.add(receiver.url)
    with db.connect() as late:
        (mid,) = db.box.publish(late, "order.created", {"n": 1})
        db.disable(endpoint.id)  # commits before the message: it stays ready, unclaimable
        late.commit()
    assert db.state(mid) == "ready"
    await drain(db)
    assert receiver.requests == []
    assert db.state(mid) == "ready"
