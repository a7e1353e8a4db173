"""Operator functions (outbox.admin) on a real database, with the dispatcher
delivering to a real HTTP receiver where a redrive must end in a delivery."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook

from dispatchers.cli import main
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from dispatchers.store.postgres import Store
from outbox import Outbox, Tenants
from outbox._queries import queries_for
from outbox.admin import (
    NO_TENANT,
    TEST_EVENT_TYPE,
    dead_count,
    dead_list,
    dead_missing,
    dead_purge,
    dead_retry,
    message_cancel,
    message_show,
    replay,
    replay_event,
    replay_message,
    send_test_event,
    status,
)
from outbox.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_WEBHOOK_MAX_ATTEMPTS
from outbox.endpoints import Endpoints
from outbox.secrets import generate_secret
from tests.database import Db
from tests.dispatching import fast_config
from tests.errors import invalid_argument
from tests.receiver import Receiver, Reply


async def drain(url: str) -> Dispatcher:
    dispatcher = Dispatcher(url, fast_config(concurrency=4), log=NullLog())
    async with asyncio.timeout(20):
        await dispatcher.run(drain=True)
    return dispatcher


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


# -- dead_list ---------------------------------------------------------------


def test_dead_list_is_newest_first_and_filters(db: Db) -> None:
    ep = db.endpoint(event_types=["order.created", "order.paid"])
    old = db.enqueue("old")
    new = db.enqueue("new")
    (created,) = db.publish("order.created", "e1")
    (paid,) = db.publish("order.paid", "e2")
    db.enqueue("alive")
    db.kill(old, died=timedelta(hours=3))
    db.kill(new, died=timedelta(minutes=1))
    db.kill(created, died=timedelta(minutes=2))
    db.kill(paid, died=timedelta(hours=2))

    with db.tx() as conn:
        everything = dead_list(conn)
        assert [m.id for m in everything] == [new, created, paid, old]
        first = everything[0]
        assert (first.idempotency_key, first.url, first.attempts, first.max_attempts) == (
            "new",
            "https://example.com/hook",
            3,
            DEFAULT_MAX_ATTEMPTS,
        )
        assert first.last_status == 500
        assert first.last_error == "HTTP 500 Internal Server Error"
        by_endpoint = dead_list(conn, endpoint_id=ep)
        assert [m.id for m in by_endpoint] == [created, paid]
        assert by_endpoint[0].url == "https://example.com/wh"
        assert by_endpoint[0].endpoint_id == ep
        assert [m.id for m in dead_list(conn, event_type="order.paid")] == [paid]
        since = datetime.now(UTC) - timedelta(minutes=30)
        assert [m.id for m in dead_list(conn, since=since)] == [new, created]
        assert [m.id for m in dead_list(conn, limit=2)] == [new, created]


def test_dead_list_rejects_bad_input_naming_the_field(db: Db) -> None:
    with db.tx() as conn:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"since": datetime(2024, 1, 1)}, "since"),  # naive on purpose
            ({"limit": 0}, "limit"),
            ({"endpoint_id": -1}, "endpoint_id"),
            ({"event_type": "has space"}, "event_type"),
            ({"tenant": "-customer"}, "tenant"),
        ]
        for kwargs, field in cases:
            with invalid_argument(field):
                dead_list(conn, **kwargs)


def test_dead_list_walks_the_dead_index(db: Db) -> None:
    with db.tx() as conn:
        conn.execute("SET LOCAL enable_seqscan = off")
        statement = queries_for("outbox")["dead_list"]
        params = {
            "endpoint_id": None,
            "event_type": None,
            "since": None,
            "tenant": None,
            "limit": 10,
        }
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement.text, params).fetchall())
    assert "messages_dead_idx" in plan


def test_dead_letters_are_selected_by_tenant_or_as_no_tenants(db: Db) -> None:
    with db.tx() as conn:
        Tenants().add(conn, "customer-17")
        Tenants().add(conn, "customer-18")
    mine = db.endpoint(event_types=["order.paid"])
    theirs = db.endpoint(event_types=["order.paid"], tenant="customer-17")
    others = db.endpoint(event_types=["order.paid"], tenant="customer-18")
    gone = db.endpoint(event_types=["order.paid"], tenant="customer-18")
    with db.tx() as conn:
        box = Outbox()
        (own,) = box.publish(conn, "order.paid", {}, idempotency_key="e1")
        (first,) = box.publish(conn, "order.paid", {}, idempotency_key="e1", tenant="customer-17")
        for_18 = box.publish(conn, "order.paid", {}, idempotency_key="e1", tenant="customer-18")
    plain = db.enqueue("plain")
    for message in (own, first, *for_18, plain):
        db.kill(message)
    with db.tx() as conn:
        Endpoints().delete(conn, gone)  # its message stays dead, whose it was unrecorded
    orphan = max(for_18)
    with db.tx() as conn:
        assert [m.endpoint_id for m in dead_list(conn, tenant="customer-17")] == [theirs]
        assert {m.id for m in dead_list(conn, tenant="customer-18")} == {min(for_18)}
        no_tenants = dead_list(conn, tenant=NO_TENANT)
        assert {(m.id, m.endpoint_id) for m in no_tenants} == {(own, mine), (plain, None)}
        assert dead_list(conn, tenant="customer-99") == []
        assert len(dead_list(conn)) == 5  # the deleted endpoint's one too
        assert dead_count(conn, tenant="customer-18") == 1
        assert dead_count(conn, tenant="customer-17", endpoint_id=others) == 0
        assert dead_retry(conn, tenant="customer-17") == 1
        assert dead_purge(conn, tenant=NO_TENANT) == 2
    assert db.row(first)[0] == "ready"
    remaining = db.query("SELECT id FROM outbox.messages WHERE state = 'dead' ORDER BY id")
    assert remaining == [(min(for_18),), (orphan,)]
    assert db.query("SELECT count(*) FROM outbox.messages WHERE id IN (%s, %s)", own, plain) == [
        (0,)
    ]


# -- message_cancel ------------------------------------------------------------


def test_message_cancel_kills_waiting_messages_and_passes_held_ones_over(db: Db) -> None:
    due = db.enqueue("due")
    later = db.enqueue("later", available_at=datetime.now(UTC) + timedelta(hours=1))
    held = db.enqueue("held")
    done = db.enqueue("done")
    db.query(
        "UPDATE outbox.messages SET state = 'running', lease_owner = 'd1',"
        " lease_until = now() + interval '1 minute', attempts = 1 WHERE id = %s RETURNING id",
        held,
    )
    db.kill(done)  # dead already: nothing to cancel

    with db.tx() as conn:
        assert message_cancel(conn, [later, held, due, done, 10**12]) == [due, later]
    for mid in (due, later):
        state, _, _, _, _, _ = db.row(mid)
        assert state == "dead"
        ((error,),) = db.query("SELECT last_error FROM outbox.messages WHERE id = %s", mid)
        assert error == "cancelled by an operator"
    assert db.row(held)[0] == "running"  # a dispatcher holds it: left alone
    with db.tx() as conn:
        assert dead_retry(conn, ids=[due]) == 1  # a cancelled message is a dead letter
    assert db.row(due)[0] == "ready"


def test_message_cancel_refuses_bad_input_naming_the_field(db: Db) -> None:
    mid = db.enqueue("k")
    with db.tx() as conn:
        with invalid_argument("ids"):
            message_cancel(conn, [-1])
        with invalid_argument("reason"):
            message_cancel(conn, [mid], reason=" ")
    assert db.row(mid)[0] == "ready"


# -- dead_retry --------------------------------------------------------------


def test_dead_retry_refuses_an_empty_selection(db: Db) -> None:
    mid = db.enqueue("k")
    db.kill(mid)
    with db.tx() as conn:
        with invalid_argument("ids"):
            dead_retry(conn)
        with invalid_argument("ids"):
            dead_retry(conn, ids=[])
        with invalid_argument("all_"):
            dead_retry(conn, ids=[mid], all_=True)
        with invalid_argument("budget"):
            dead_retry(conn, ids=[mid], budget=0)
    assert db.row(mid)[0] == "dead"


def test_dead_retry_keeps_attempts_and_raises_the_budget(db: Db) -> None:
    mid = db.enqueue("k1", max_attempts=3)
    other = db.enqueue("k2")
    db.kill(mid, attempts=3)
    db.kill(other, attempts=2)
    with db.tx() as conn:
        assert dead_retry(conn, ids=[mid]) == 1
    state, attempts, max_attempts, cleared, due, key = db.row(mid)
    assert (state, attempts, max_attempts, cleared, due, key) == (
        "ready",
        3,
        3 + DEFAULT_MAX_ATTEMPTS,
        True,
        True,
        "k1",
    )
    assert db.row(other)[0] == "dead"  # not selected
    # the new budget starts the retry schedule again
    assert db.query("SELECT retry_base FROM outbox.messages WHERE id = %s", mid) == [(3,)]
    with db.tx() as conn:
        assert dead_retry(conn, ids=[other], budget=2) == 1
        assert dead_retry(conn, ids=[other]) == 0  # not dead any more
    assert db.row(other)[:3] == ("ready", 2, 4)


def test_dead_missing_names_the_ids_of_no_dead_message_in_order(db: Db) -> None:
    dead = db.enqueue("k1")
    waiting = db.enqueue("k2")
    db.kill(dead)
    with db.tx() as conn:
        assert dead_missing(conn, [999_999, waiting, dead, 999_999]) == [waiting, 999_999]
        assert dead_missing(conn, [dead]) == []
        assert dead_missing(conn, []) == []


@pytest.mark.parametrize("bad", [2**63, 10**30, 0, True])
def test_an_id_past_bigint_is_refused_before_any_statement(db: Db, bad: int) -> None:
    mid = db.enqueue("k")
    db.kill(mid)
    with db.tx() as conn:
        for call in (dead_retry, dead_purge, dead_count):
            with invalid_argument("ids"):
                call(conn, ids=[mid, bad])
        with invalid_argument("ids"):
            dead_missing(conn, [bad])
        with invalid_argument("endpoint_id"):
            dead_list(conn, endpoint_id=bad)
        with invalid_argument("message_id"):
            message_show(conn, bad)
        assert dead_retry(conn, ids=[mid]) == 1  # nothing reached the server: still usable
    assert db.row(mid)[0] == "ready"


def test_retried_message_is_claimed_with_the_next_attempt_number_and_delivered(
    db: Db, receiver: Receiver
) -> None:
    mid = db.enqueue("redrive-me", url=receiver.url + "/x", max_attempts=2)
    db.kill(mid, attempts=2)
    with db.tx() as conn:
        assert dead_retry(conn, ids=[mid]) == 1

    claim, params = Store(db.url, fast_config()).claim_statement("test:2:y", 10, capped=True)
    with db.tx() as conn:
        # bound client-side, as the store binds it
        claimed = psycopg.ClientCursor(conn).execute(claim.text, params).fetchall()
    assert [(r[0], r[7], r[8]) for r in claimed] == [(mid, 3, 2 + DEFAULT_MAX_ATTEMPTS)]
    # give it back, as a dispatcher whose lease expired would
    db.query(
        "UPDATE outbox.messages SET state = 'ready', attempts = attempts - 1,"
        " lease_owner = NULL, lease_until = NULL WHERE id = %s",
        mid,
    )

    asyncio.run(drain(db.url))
    (request,) = receiver.requests
    assert request.headers["idempotency-key"] == '"redrive-me"'
    assert db.query("SELECT id, attempts FROM outbox.delivered") == [(mid, 3)]
    assert db.query(
        "SELECT attempt, outcome FROM outbox.attempts WHERE message_id = %s ORDER BY attempt",
        mid,
    ) == [(1, "retry"), (2, "failed"), (3, "delivered")]


def test_dead_retry_by_filters_and_all(db: Db) -> None:
    ep = db.endpoint(event_types=["a.b", "c.d"])
    (ab,) = db.publish("a.b", "e1")
    (cd,) = db.publish("c.d", "e2")
    plain_old = db.enqueue("p1")
    plain_new = db.enqueue("p2")
    for mid in (ab, cd, plain_new):
        db.kill(mid)
    db.kill(plain_old, died=timedelta(days=2))

    with db.tx() as conn:
        assert dead_count(conn, endpoint_id=ep, event_type="a.b") == 1
        assert dead_retry(conn, endpoint_id=ep, event_type="a.b") == 1
    assert db.row(ab)[:3] == ("ready", 3, 3 + DEFAULT_WEBHOOK_MAX_ATTEMPTS)
    assert db.row(cd)[0] == "dead"

    with db.tx() as conn:
        assert dead_retry(conn, since=datetime.now(UTC) - timedelta(hours=1)) == 2
    assert db.row(cd)[0] == "ready"
    assert db.row(plain_new)[0] == "ready"
    assert db.row(plain_old)[0] == "dead"

    with db.tx() as conn:
        assert dead_retry(conn, all_=True) == 1
    assert db.query("SELECT count(*) FROM outbox.messages WHERE state = 'dead'") == [(0,)]


def test_dead_retry_pauses_messages_of_a_disabled_endpoint(db: Db) -> None:
    ep = db.endpoint()
    (mid,) = db.publish("x.y", "e1")
    db.kill(mid)
    with db.tx() as conn:
        Endpoints().disable(conn, ep, reason="maintenance")
        assert dead_retry(conn, ids=[mid]) == 1
    assert db.row(mid)[:3] == ("paused", 3, 3 + DEFAULT_WEBHOOK_MAX_ATTEMPTS)
    with db.tx() as conn:
        assert Endpoints().enable(conn, ep) == 1
    assert db.row(mid)[0] == "ready"


def test_dead_retry_leaves_messages_of_a_deleted_endpoint_dead(db: Db) -> None:
    ep = db.endpoint()
    (mid,) = db.publish("x.y", "e1")
    with db.tx() as conn:
        Endpoints().delete(conn, ep)
    assert db.row(mid)[0] == "dead"
    with db.tx() as conn:
        assert [m.endpoint_id for m in dead_list(conn, endpoint_id=ep)] == [ep]
        assert dead_retry(conn, all_=True) == 0
    assert db.row(mid)[0] == "dead"


# -- dead_purge --------------------------------------------------------------


def test_dead_purge_deletes_messages_and_attempts_but_keeps_the_key(db: Db) -> None:
    gone = db.enqueue("purge-me")
    kept = db.enqueue("keep-me")
    alive = db.enqueue("alive")
    db.kill(gone)
    db.kill(kept, died=timedelta(days=3))
    with db.tx() as conn:
        with invalid_argument("ids"):
            dead_purge(conn)
        assert dead_purge(conn, since=datetime.now(UTC) - timedelta(days=1)) == 1
    assert db.query("SELECT id FROM outbox.messages ORDER BY id") == [(kept,), (alive,)]
    assert db.query("SELECT DISTINCT message_id FROM outbox.attempts") == [(kept,)]
    # the key stays used: enqueuing it again writes nothing and returns the old id
    assert db.enqueue("purge-me") == gone
    assert db.query("SELECT count(*) FROM outbox.messages WHERE id = %s", gone) == [(0,)]
    with db.tx() as conn:
        assert dead_purge(conn, ids=[kept, alive]) == 1  # alive is not dead
        assert message_show(conn, kept) is None
    assert db.query("SELECT id FROM outbox.messages") == [(alive,)]


# -- replay ------------------------------------------------------------------


async def test_replay_moves_history_back_and_redelivers_with_the_same_webhook_id(
    db: Db, receiver: Receiver
) -> None:
    ep = db.endpoint(url=receiver.url + "/hook")
    other = db.endpoint(url=receiver.url + "/other")
    ids = db.publish("order.created", "evt-1") + db.publish("order.created", "evt-2")
    mine = sorted(
        i
        for i in ids
        if db.query("SELECT endpoint_id FROM outbox.messages WHERE id = %s", i) == [(ep,)]
    )
    await drain(db.url)
    assert len(receiver.requests) == 4
    first_ids = sorted(r.headers["webhook-id"] for r in receiver.requests if r.path == "/hook")
    assert first_ids == [f"evt-1:{ep}", f"evt-2:{ep}"]

    with db.tx() as conn:
        assert replay(conn, endpoint_id=ep, since=datetime.now(UTC) - timedelta(hours=1)) == 2
    assert db.query(
        "SELECT id, state, attempts, max_attempts FROM outbox.messages ORDER BY id"
    ) == [(i, "ready", 1, 1 + DEFAULT_WEBHOOK_MAX_ATTEMPTS) for i in mine]
    assert db.query("SELECT count(*) FROM outbox.delivered WHERE endpoint_id = %s", ep) == [(0,)]
    assert db.query("SELECT count(*) FROM outbox.delivered WHERE endpoint_id = %s", other) == [(2,)]

    await drain(db.url)
    again = sorted(r.headers["webhook-id"] for r in receiver.requests[4:])
    assert again == first_ids
    assert db.query(
        "SELECT id, attempts FROM outbox.delivered WHERE endpoint_id = %s ORDER BY id", ep
    ) == [(i, 2) for i in mine]
    assert db.query(
        "SELECT message_id, attempt, outcome FROM outbox.attempts WHERE message_id = %s"
        " ORDER BY attempt",
        mine[0],
    ) == [(mine[0], 1, "delivered"), (mine[0], 2, "delivered")]


def test_replay_takes_only_the_window_and_refuses_bad_endpoints(db: Db) -> None:
    ep = db.endpoint()
    now = datetime.now(UTC)
    for i, age in enumerate((timedelta(days=3), timedelta(hours=5), timedelta(minutes=5))):
        db.query(
            "INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, method,"
            " headers, body, content_type, event_type, attempts, max_attempts, last_status,"
            " created_at, completed_at) VALUES (%s, %s, %s, %s, 'POST', '{}', '{}',"
            " 'application/json', 't.x', 1, 8, 200, %s, %s)",
            1000 + i,
            f"evt-{i}:{ep}",
            f"endpoint:{ep}",
            ep,
            now - age,
            now - age,
        )
    with db.tx() as conn:
        assert (
            replay(
                conn, endpoint_id=ep, since=now - timedelta(days=1), until=now - timedelta(hours=1)
            )
            == 1
        )
    assert db.query("SELECT id FROM outbox.messages") == [(1001,)]

    with db.tx() as conn:
        with invalid_argument("endpoint_id"):
            replay(conn, endpoint_id=ep + 1, since=now - timedelta(days=7))
        with invalid_argument("until"):
            replay(conn, endpoint_id=ep, since=now, until=now - timedelta(hours=1))
        with invalid_argument("since"):
            replay(conn, endpoint_id=ep, since=now.replace(tzinfo=None))
        Endpoints().disable(conn, ep)
        with invalid_argument("endpoint_id", match="disabled"):
            replay(conn, endpoint_id=ep, since=now - timedelta(days=7))
    assert db.query("SELECT count(*) FROM outbox.delivered") == [(2,)]


def test_one_delivered_webhook_is_replayed_by_id(db: Db) -> None:
    ep = db.endpoint()
    now = datetime.now(UTC)
    for message_id, endpoint in ((500, ep), (501, None)):
        db.query(
            "INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, url, method,"
            " headers, body, content_type, event_type, attempts, max_attempts, last_status,"
            " created_at, completed_at) VALUES (%s, %s, %s, %s, %s, 'POST', '{}', '{}',"
            " 'application/json', 't.x', 2, 8, 200, %s, %s)",
            message_id,
            f"evt-{message_id}",
            f"endpoint:{ep}" if endpoint else "https://example.com/plain",
            endpoint,
            None if endpoint else "https://example.com/plain",
            now,
            now,
        )
    with db.tx() as conn:
        assert replay_message(conn, message_id=500, budget=3)
        assert not replay_message(conn, message_id=500)  # no longer in the history
        assert not replay_message(conn, message_id=999)
        with invalid_argument("message_id", match="not a webhook"):
            replay_message(conn, message_id=501)
        with invalid_argument("message_id"):
            replay_message(conn, message_id=0)
    assert db.query(
        "SELECT id, idempotency_key, destination, state, attempts, max_attempts"
        " FROM outbox.messages"
    ) == [(500, "evt-500", f"endpoint:{ep}", "ready", 2, 5)]
    assert db.query("SELECT id FROM outbox.delivered") == [(501,)]
    with db.tx() as conn:
        Endpoints().disable(conn, ep)
    # the plain message, made a webhook of the now disabled endpoint
    db.query("UPDATE outbox.delivered SET target = %s, endpoint_id = %s", f"endpoint:{ep}", ep)
    with db.tx() as conn, invalid_argument("endpoint_id", match="disabled"):
        replay_message(conn, message_id=501)


async def test_an_old_event_reaches_an_endpoint_added_since_and_no_other(
    db: Db, receiver: Receiver
) -> None:
    first = db.endpoint(url=receiver.url + "/first", event_types=["order.paid"])
    (sent,) = db.publish("order.paid", "evt-9")
    await drain(db.url)
    later = db.endpoint(url=receiver.url + "/later", event_types=["order.*"])
    # publishing the key again writes nothing, whatever subscribed since
    assert db.publish("order.paid", "evt-9") == [sent]

    with db.tx() as conn:
        new = replay_event(conn, event_key="evt-9", endpoint_id=later)
        assert new.created
        # a second call finds the endpoint's message: one per endpoint and event
        assert replay_event(conn, event_key="evt-9", endpoint_id=later) == (new.id, False)
        # the endpoint that had it keeps its delivered message
        assert replay_event(conn, event_key="evt-9", endpoint_id=first) == (sent, False)
    # the event now records the new message: publishing the key again returns both
    assert sorted(db.publish("order.paid", "evt-9")) == sorted([sent, new.id])

    await drain(db.url)
    by_path = {r.path: r for r in receiver.requests}
    assert sorted(by_path) == ["/first", "/later"] and len(receiver.requests) == 2
    assert by_path["/later"].headers["webhook-id"] == f"evt-9:{later}"
    assert by_path["/later"].body == by_path["/first"].body  # the same envelope

    with db.tx() as conn:
        with invalid_argument("event_key", match="no event is recorded"):
            replay_event(conn, event_key="evt-never", endpoint_id=later)
        with invalid_argument("endpoint_id"):
            replay_event(conn, event_key="evt-9", endpoint_id=later + 100)
        Endpoints().disable(conn, later)
        with invalid_argument("endpoint_id", match="disabled"):
            replay_event(conn, event_key="evt-9", endpoint_id=later)
    # an event whose messages were all purged has nothing to send
    third = db.endpoint(url=receiver.url + "/third")
    db.query("DELETE FROM outbox.delivered")
    with db.tx() as conn, invalid_argument("event_key", match="purged"):
        replay_event(conn, event_key="evt-9", endpoint_id=third)


async def test_a_test_event_is_signed_sent_once_and_refused_for_a_disabled_endpoint(
    db: Db, receiver: Receiver
) -> None:
    receiver.responder = lambda request: Reply(503)  # a failed test: one attempt, then dead
    secret = generate_secret()
    ep = db.endpoint(url=receiver.url + "/hook", event_types=["order.paid"], secret=secret)
    with db.tx() as conn:
        first = send_test_event(conn, endpoint_id=ep)
        second = send_test_event(conn, endpoint_id=ep)
    await drain(db.url)

    assert len(receiver.requests) == 2
    for request in receiver.requests:
        envelope = Webhook(secret).verify(request.body, request.headers)
        assert envelope["type"] == TEST_EVENT_TYPE and envelope["data"]["endpoint_id"] == ep
    webhook_ids = {r.headers["webhook-id"] for r in receiver.requests}
    assert len(webhook_ids) == 2 and all(i.endswith(f":{ep}") for i in webhook_ids)
    assert db.query("SELECT id, state, attempts FROM outbox.messages ORDER BY id") == [
        (first, "dead", 1),
        (second, "dead", 1),
    ]
    with db.tx() as conn:
        Endpoints().disable(conn, ep)
        with invalid_argument("endpoint_id", match="disabled"):
            send_test_event(conn, endpoint_id=ep)
        with invalid_argument("endpoint_id"):
            send_test_event(conn, endpoint_id=ep + 1)


# -- message_show and status ---------------------------------------------------


def test_message_show_finds_waiting_dead_and_delivered_messages(db: Db) -> None:
    mid = db.enqueue("show-me", headers={"X-Tenant": "acme"})
    db.kill(mid, attempts=2)
    db.query(
        "INSERT INTO outbox.delivered (id, idempotency_key, target, url, method, headers,"
        " body, content_type, attempts, max_attempts, last_status, created_at, completed_at)"
        " VALUES (77, 'done', 'https://example.com/d', 'https://example.com/d', 'PUT', '{}',"
        " 'hi', 'text/plain', 1, 12, 204, now(), now())"
    )
    with db.tx() as conn:
        info = message_show(conn, mid)
        delivered = message_show(conn, 77)
        assert message_show(conn, 12345) is None
        with invalid_argument("message_id"):
            message_show(conn, 0)
    assert info is not None and delivered is not None
    assert (info.state, info.idempotency_key, info.attempts, info.headers) == (
        "dead",
        "show-me",
        2,
        {"X-Tenant": "acme"},
    )
    assert info.body == b'{"key":"show-me"}'
    assert [(a.attempt, a.outcome, a.status, a.owner) for a in info.attempt_log] == [
        (1, "retry", 500, "test:1:x"),
        (2, "failed", 500, "test:1:x"),
    ]
    assert info.as_dict()["headers"] == {"X-Tenant": "…"}
    assert "body" not in info.as_dict()
    assert info.as_dict(show_headers=True, show_body=True)["body"] == '{"key":"show-me"}'
    assert (delivered.state, delivered.method, delivered.last_status, delivered.body) == (
        "delivered",
        "PUT",
        204,
        b"hi",
    )
    assert delivered.attempt_log == []


def test_status_counts_states_lag_recent_attempts_and_endpoints(db: Db) -> None:
    ep = db.endpoint(event_types=["a.b"])
    paused_ep = db.endpoint(url="https://example.com/paused", event_types=["p.q"])
    (dead,) = db.publish("a.b", "e1")
    db.publish("p.q", "e2")
    with db.tx() as conn:
        assert Endpoints().disable(conn, paused_ep) == 1
    due = db.enqueue("due")
    db.enqueue("later", available_at=datetime.now(UTC) + timedelta(hours=1))
    live = db.enqueue("live")
    expired = db.enqueue("expired")
    db.kill(dead)
    db.query(
        "UPDATE outbox.messages SET available_at = now() - interval '90 seconds' WHERE id = %s",
        due,
    )
    db.query(
        "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'h:1:z',"
        " lease_until = now() + interval '30 seconds' WHERE id = %s",
        live,
    )
    db.query(
        "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'h:1:z',"
        " lease_until = now() - interval '30 seconds' WHERE id = %s",
        expired,
    )
    db.query(
        "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)"
        " VALUES (500, 1, 'h', now(), 'delivered'), (501, 1, 'h', now(), 'delivered'),"
        " (502, 1, 'h', now() - interval '1 hour', 'delivered'),"
        " (503, 1, 'h', now(), 'retry')"
    )
    db.query("UPDATE outbox.endpoints SET failure_streak = 4 WHERE id = %s", ep)

    with db.tx() as conn:
        snapshot = status(conn)
    assert snapshot["messages"] == {
        "ready": 1,
        "blocked": 0,
        "scheduled": 1,
        "held_unsent": 0,
        "running": 1,
        "lease_expired": 1,
        "paused": 1,
        "dead": 1,
    }
    assert 89 <= snapshot["oldest_ready_age_s"] < 120
    # db.kill wrote three recent failed attempts for the dead message
    assert snapshot["last_5_minutes"] == {"delivered": 2, "failed": 1 + 3}
    assert [
        (e["id"], e["enabled"], e["failure_streak"], e["pending"], e["dead"])
        for e in snapshot["endpoints"]
    ] == [(ep, True, 4, 0, 1), (paused_ep, False, 0, 1, 0)]


def test_status_of_an_empty_outbox(db: Db) -> None:
    with db.tx() as conn:
        snapshot = status(conn)
    assert snapshot["oldest_ready_age_s"] is None
    assert set(snapshot["messages"].values()) == {0}
    assert snapshot["endpoints"] == []


@pytest.mark.parametrize(
    ("state", "until", "line"),
    [
        ("held", "10 minutes", "held: https://held.example:443 until "),
        ("open", "10 minutes", "breaker open: https://held.example:443, next probe at "),
        ("open", "-10 minutes", "breaker open: https://held.example:443, a probe is due since "),
    ],
)
def test_due_messages_a_breaker_or_a_hold_keeps_back_are_blocked_not_ready_nor_late(
    db: Db, capsys: pytest.CaptureFixture[str], state: str, until: str, line: str
) -> None:
    blocked = db.enqueue("blocked", url="https://held.example/x")
    free = db.enqueue("free", url="https://free.example/x")
    db.query(
        "UPDATE outbox.messages SET available_at = now() - interval '5 minutes' WHERE id = %s",
        blocked,
    )
    db.query(
        "UPDATE outbox.messages SET available_at = now() - interval '30 seconds' WHERE id = %s",
        free,
    )
    db.query(
        "INSERT INTO outbox.destination_health (destination, state, blocked_until, opened_at)"
        " VALUES ('https://held.example:443', %s, now() + CAST(%s AS interval),"
        " CASE WHEN %s = 'open' THEN now() END)",
        state,
        until,
        state,
    )
    with db.tx() as conn:
        snapshot = status(conn)
    assert (snapshot["messages"]["ready"], snapshot["messages"]["blocked"]) == (1, 1)
    assert 29 <= snapshot["oldest_ready_age_s"] < 120  # the free one's wait, not 5 min
    assert main(["status", "--database-url", db.url, "--max-lag", "200"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^blocked \(breaker or hold\) +1$", out, flags=re.M), out
    assert line in out, out


def test_admin_functions_run_in_a_sqlalchemy_session(db: Db) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from outbox.dsn import sqlalchemy_url

    ep = db.endpoint()
    (webhook,) = db.publish("a.b", "e1")
    plain = db.enqueue("plain")
    db.kill(webhook)
    db.kill(plain)
    engine = create_engine(sqlalchemy_url(db.url))
    try:
        with Session(engine) as session, session.begin():
            assert [m.id for m in dead_list(session, endpoint_id=ep)] == [webhook]
            assert dead_retry(session, ids=[webhook, plain]) == 2
            info = message_show(session, plain)
            assert info is not None and info.state == "ready"
            assert status(session)["messages"]["ready"] == 2
        db.query("UPDATE outbox.messages SET state = 'dead' WHERE id = %s", plain)
        with Session(engine) as session, session.begin():
            assert dead_purge(session, endpoint_id=None, ids=[plain]) == 1
    finally:
        engine.dispose()
    assert db.query("SELECT id, state FROM outbox.messages") == [(webhook, "ready")]
