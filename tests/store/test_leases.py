"""The heartbeat and the rescuer, one round at a time, against the real database
(retention: ``test_retention``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatchers.runtime.flights import Flights
from dispatchers.runtime.log import NullLog
from dispatchers.runtime.maintenance import Heartbeat, Rescuer
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.postgres import Store
from tests.database import Db
from tests.dispatching import fast_config
from tests.jobs import job

URL = "https://example.com/hook"


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    store = Store(database_url, fast_config(retention=7 * 86400.0))
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def report() -> Reporter:
    return Reporter(NullLog())


async def test_the_rescuer_hands_on_expired_leases_and_ends_spent_ones(
    db: Db, store: Store
) -> None:
    again = db.enqueue("again", URL)
    spent = db.enqueue("spent", URL, max_attempts=1)
    held = db.enqueue("held", URL)
    jobs = (await store.claim("owner-a", 3)).messages
    assert sorted(j.id for j in jobs) == sorted([again, spent, held])
    db.expire(again)
    db.expire(spent)
    woken: list[bool] = []
    reporter = report()
    rescuer = Rescuer(store, reporter, interval=60.0, rescued=lambda: woken.append(True))

    assert sorted(await rescuer.run_once()) == sorted([(again, "ready"), (spent, "dead")])

    assert dict(db.query("SELECT id, state FROM outbox.messages")) == {
        again: "ready",
        spent: "dead",
        held: "running",
    }
    assert reporter.stats.rescued == 2
    assert woken == [True]
    assert await rescuer.run_once() == []
    assert woken == [True]  # nothing rescued: nobody woken


async def test_the_heartbeat_renews_its_leases_and_reports_a_stolen_one_lost(
    db: Db, store: Store
) -> None:
    kept = db.enqueue("kept", URL)
    stolen = db.enqueue("stolen", URL)
    jobs = {j.id: j for j in (await store.claim("owner-a", 2)).messages}
    db.query("UPDATE outbox.messages SET lease_until = now() + interval '1 second' RETURNING id")
    db.query(
        "UPDATE outbox.messages SET lease_owner = 'thief', attempts = attempts + 1"
        " WHERE id = %s RETURNING id",
        stolen,
    )
    lost: list[tuple[int, int]] = []
    reporter = report()
    flights = Flights(per_destination=10)
    for j in jobs.values():
        flights.hold(job(id=j.id, attempts=j.attempts))
    heartbeat = Heartbeat(
        store,
        reporter,
        owner="owner-a",
        interval=1.0,
        flights=flights,
        lost=lambda message_id, attempt: lost.append((message_id, attempt)),
    )

    assert await heartbeat.run_once() == [(stolen, 1)]

    assert lost == [(stolen, 1)]
    assert reporter.stats.renewals == 1
    ((renewed_for,),) = db.query(
        "SELECT extract(epoch FROM lease_until - now()) FROM outbox.messages WHERE id = %s", kept
    )
    assert 2.0 < float(renewed_for) <= 3.0  # a whole lease (3 s) from now again
    assert db.query("SELECT lease_owner, attempts FROM outbox.messages WHERE id = %s", stolen) == [
        ("thief", 2)
    ]


async def test_the_heartbeat_sends_nothing_while_nothing_is_held(store: Store) -> None:
    heartbeat = Heartbeat(
        store,
        report(),
        owner="owner-a",
        interval=1.0,
        flights=Flights(per_destination=10),
        lost=lambda message_id, attempt: None,
    )
    assert await heartbeat.run_once() == []
    assert store.round_trips == 0
