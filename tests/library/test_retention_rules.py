"""Retention rules against real PostgreSQL: the payloads of an endpoint's, or an
event type's, delivered messages are erased past the rule's period, by every
dispatcher's retention, and recorded; the delivery record stays, the rest of the
history is untouched, and an erased message is never replayed."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from dispatchers.cli import main
from outbox import InvalidArgument, Outbox, RetentionRules
from outbox.admin import EXPUNGED_BODY, replay_message
from outbox.endpoints import Endpoints
from tests import database
from tests.dispatching import drain, fast_config, running
from tests.receiver import Receiver, Reply
from tests.waiting import until

PAYLOAD = {"email": "ada@example.com"}
DAY = 24 * 3600.0


class Db(database.Db):
    """The shared test database, with what these tests do to the history."""

    def run(self, call: Any, **kwargs: Any) -> Any:
        with self.tx() as conn:
            return call(conn, **kwargs)

    def age(self, ids: list[int], by: timedelta) -> None:
        """Make delivered messages look delivered ``by`` ago (as a day passing would)."""
        self.query(
            "UPDATE outbox.delivered SET completed_at = completed_at - %s WHERE id = ANY (%s)",
            by,
            ids,
        )

    def bodies(self) -> dict[int, tuple[bytes, Any, bool]]:
        rows = self.query("SELECT id, body, headers, expunged_at IS NOT NULL FROM outbox.delivered")
        return {r[0]: (bytes(r[1]), r[2], r[3]) for r in rows}

    def expire(self, batch: int = 1000) -> list[tuple[int, int]]:
        return self.query("SELECT rule_id, erased FROM outbox.expire_payloads(%s)", batch)


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


def answering() -> Receiver:
    return Receiver(lambda request: Reply(body=b"thanks ada@example.com"))


async def test_an_endpoints_rule_erases_its_old_payloads_and_keeps_the_record(db: Db) -> None:
    with answering() as receiver:
        with psycopg.connect(db.url) as conn:
            short = Endpoints().add(conn, url=receiver.url + "/short").id
            other = Endpoints().add(conn, url=receiver.url + "/other").id
            for n in range(3):
                Outbox().publish(conn, "order.paid", PAYLOAD, idempotency_key=f"order-{n}")
            rule = RetentionRules().set(conn, endpoint_id=short, payload_retention=DAY)
        await drain(db, fast_config())
    by_endpoint: dict[int, list[int]] = {}
    for message_id, endpoint_id in db.query(
        "SELECT id, endpoint_id FROM outbox.delivered ORDER BY id"
    ):
        by_endpoint.setdefault(endpoint_id, []).append(message_id)
    old = by_endpoint[short][:2] + by_endpoint[other][:2]
    db.age(old, timedelta(days=2))
    before = db.bodies()
    record = db.query(
        "SELECT id, idempotency_key, endpoint_id, last_status, created_at, completed_at"
        " FROM outbox.delivered ORDER BY id"
    )

    assert db.expire() == [(rule.id, 2)]

    after = db.bodies()
    erased = set(by_endpoint[short][:2])
    for message_id, (body, headers, expunged) in after.items():
        if message_id in erased:
            assert (body, headers, expunged) == (EXPUNGED_BODY, {}, True)
        else:
            assert (body, headers, expunged) == before[message_id]
            assert b"ada@example.com" in body
    # ids, keys, statuses and times stand; the answers of the erased are gone
    assert (
        db.query(
            "SELECT id, idempotency_key, endpoint_id, last_status, created_at, completed_at"
            " FROM outbox.delivered ORDER BY id"
        )
        == record
    )
    answers = dict(db.query("SELECT message_id, response_excerpt FROM outbox.attempts"))
    assert {i for i, excerpt in answers.items() if excerpt is None} == erased
    recorded = db.query("SELECT scope, selector, messages, history FROM outbox.expunges")
    assert recorded == [
        ("retention", {"rule_id": rule.id, "endpoint_id": short, "payload_retention_s": DAY}, 0, 2)
    ]
    # the next round reads from where this one stopped, and finds nothing new
    (stopped,) = db.query(
        "SELECT erased_until > now() - interval '1 day 1 minute' FROM outbox.retention_rules"
    )
    assert stopped == (True,)
    assert db.expire() == [(rule.id, 0)]
    assert len(db.query("SELECT id FROM outbox.expunges")) == 1
    # an erased message is never sent again
    with pytest.raises(InvalidArgument) as caught:
        db.run(replay_message, message_id=by_endpoint[short][0])
    assert caught.value.field == "message_id" and "expunged" in str(caught.value)


async def test_an_event_types_rule_erases_that_type_at_every_endpoint_and_the_shorter_applies(
    db: Db,
) -> None:
    with answering() as receiver:
        with psycopg.connect(db.url) as conn:
            first = Endpoints().add(conn, url=receiver.url + "/a").id
            Endpoints().add(conn, url=receiver.url + "/b")
            Outbox().publish(conn, "user.signed_up", PAYLOAD, idempotency_key="signup")
            Outbox().publish(conn, "order.paid", PAYLOAD, idempotency_key="order")
            rules = RetentionRules()
            # the endpoint keeps payloads 3 days, the type 1: the type's rule erases
            rules.set(conn, endpoint_id=first, payload_retention=3 * DAY)
            by_type = rules.set(conn, event_type="user.signed_up", payload_retention=DAY)
        await drain(db, fast_config())
    everything = [i for (i,) in db.query("SELECT id FROM outbox.delivered")]
    db.age(everything, timedelta(days=2))

    served = dict(db.expire())

    assert served[by_type.id] == 2
    assert sum(served.values()) == 2
    erased = {
        event_type: expunged
        for event_type, expunged in db.query(
            "SELECT event_type, bool_and(expunged_at IS NOT NULL) FROM outbox.delivered"
            " GROUP BY event_type"
        )
    }
    assert erased == {"user.signed_up": True, "order.paid": False}


async def test_a_full_batch_stops_inside_an_instant_and_the_next_round_finishes_it(
    db: Db,
) -> None:
    with answering() as receiver:
        with psycopg.connect(db.url) as conn:
            endpoint = Endpoints().add(conn, url=receiver.url).id
            for n in range(5):
                Outbox().publish(conn, "order.paid", PAYLOAD, idempotency_key=f"o-{n}")
            RetentionRules().set(conn, endpoint_id=endpoint, payload_retention=DAY)
        await drain(db, fast_config())
    # five deliveries of the same instant: a batch of two must not skip past it
    db.query("UPDATE outbox.delivered SET completed_at = now() - interval '2 days'")

    rounds = [db.expire(batch=2)[0][1] for _ in range(4)]

    assert rounds == [2, 2, 1, 0]
    assert all(expunged for _, _, expunged in db.bodies().values())


async def test_every_dispatcher_applies_the_rules_in_its_retention(db: Db) -> None:
    with answering() as receiver:
        with psycopg.connect(db.url) as conn:
            endpoint = Endpoints().add(conn, url=receiver.url).id
            Outbox().publish(conn, "order.paid", PAYLOAD, idempotency_key="o")
            RetentionRules().set(conn, endpoint_id=endpoint, payload_retention=DAY)
        await drain(db, fast_config())
    (message_id,) = db.bodies()
    db.age([message_id], timedelta(days=2))

    async with running(db, fast_config(retention_interval=0.1)) as dispatcher:
        await until(lambda: db.bodies()[message_id][2], "the payload erased by the dispatcher")
        await until(lambda: dispatcher.stats.payloads_erased == 1, "the erasure counted")
    assert db.bodies()[message_id][0] == EXPUNGED_BODY


def test_bad_rules_are_refused_naming_the_field_and_write_nothing(db: Db) -> None:
    rules = RetentionRules()
    with psycopg.connect(db.url) as conn:
        endpoint = Endpoints().add(conn, url="https://example.com/hook").id
        conn.commit()
        cases: list[tuple[dict[str, Any], str]] = [
            ({"endpoint_id": endpoint, "payload_retention": 59}, "payload_retention"),
            ({"endpoint_id": endpoint, "payload_retention": float("nan")}, "payload_retention"),
            ({"endpoint_id": endpoint, "payload_retention": True}, "payload_retention"),
            ({"endpoint_id": endpoint, "payload_retention": 1e12}, "payload_retention"),
            ({"payload_retention": DAY}, "endpoint_id"),
            (
                {"endpoint_id": endpoint, "event_type": "a.b", "payload_retention": DAY},
                "endpoint_id",
            ),
            ({"endpoint_id": endpoint + 1000, "payload_retention": DAY}, "endpoint_id"),
            ({"endpoint_id": 0, "payload_retention": DAY}, "endpoint_id"),
            ({"event_type": "", "payload_retention": DAY}, "event_type"),
        ]
        for kwargs, field in cases:
            with pytest.raises(InvalidArgument) as caught:
                rules.set(conn, **kwargs)
            assert caught.value.field == field, kwargs
        with pytest.raises(InvalidArgument) as caught:
            rules.delete(conn, event_type="never.set")
        assert caught.value.field == "event_type"
        assert rules.all(conn) == []
        # a rule goes with its endpoint
        rules.set(conn, endpoint_id=endpoint, payload_retention=DAY)
        Endpoints().delete(conn, endpoint)
        assert rules.all(conn) == []


def test_the_retention_commands_set_list_and_delete(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    with psycopg.connect(db.url) as conn:
        endpoint = Endpoints().add(conn, url="https://example.com/hook").id
    url = ["--database-url", db.url]
    assert main(["retention", "set", "--endpoint", str(endpoint), "--payload", "1d", *url]) == 0
    assert f"endpoint {endpoint}: delivered messages keep their payloads 1d" in (
        capsys.readouterr().out
    )
    assert main(["retention", "set", "--event-type", "user.*", "--payload", "2h", *url]) == 2
    assert "event_type" in capsys.readouterr().err
    assert main(["retention", "set", "--event-type", "user.deleted", "--payload", "30s", *url]) == 2
    assert "payload_retention" in capsys.readouterr().err
    assert main(["retention", "set", "--event-type", "user.deleted", "--payload", "2h", *url]) == 0
    capsys.readouterr()
    assert main(["retention", "list", "--json", *url]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["endpoint_id"], r["event_type"], r["payload_retention_s"]) for r in listed] == [
        (endpoint, None, DAY),
        (None, "user.deleted", 7200.0),
    ]
    assert main(["retention", "delete", "--endpoint", str(endpoint), *url]) == 0
    assert main(["retention", "delete", "--endpoint", str(endpoint), *url]) == 2
    assert "endpoint_id" in capsys.readouterr().err
    assert main(["retention", "list", *url]) == 0
    assert "user.deleted" in capsys.readouterr().out


def test_a_rule_keeps_a_dispatcher_from_nothing_it_needs(db: Db) -> None:
    """Without rules, a round serves none and writes nothing."""
    assert db.expire() == []
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.expire(batch=0)
