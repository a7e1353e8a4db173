"""The dispatcher's loop against a store in memory (:class:`FakeStore`) and a
scripted HTTP client: claims, capacity, outcomes, lost leases and shutdown,
without PostgreSQL and without patching anything."""

from __future__ import annotations

import asyncio

import pytest

from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from tests.jobs import job
from tests.runtime.fakes import FakeStore, ScriptedClient
from tests.waiting import until

BOUND = 15.0  # seconds a run below may take before the test fails


def config(**overrides: object) -> DispatcherConfig:
    settings: dict[str, object] = {
        "listen": False,
        "poll_interval": 0.05,
        "claim_window": 0.0,
        "flush_interval": 0.01,
        "rescue_interval": 60.0,
    }
    settings.update(overrides)
    return DispatcherConfig(**settings)  # type: ignore[arg-type]


def dispatcher(
    store: FakeStore, client: ScriptedClient, settings: DispatcherConfig | None = None
) -> Dispatcher:
    return Dispatcher(
        "postgresql:///never-connected",
        settings or config(),
        client=client,
        log=NullLog(),
        store=store,
        owner="me",
    )


async def test_a_drain_sends_each_message_once_and_records_it_delivered() -> None:
    store, client = FakeStore(), ScriptedClient()
    for message_id in range(1, 6):
        store.add(message_id)

    stats = await asyncio.wait_for(dispatcher(store, client).run(drain=True), BOUND)

    assert stats.delivered == 5
    assert sorted(h["Idempotency-Key"] for _, h in client.requests) == sorted(
        f'"key-{i}"' for i in range(1, 6)
    )
    for row in store.rows.values():
        assert row.state == "delivered"
        ((outcome,),) = [row.outcomes]
        assert (outcome.attempt, outcome.outcome, outcome.status) == (1, "delivered", 200)
    assert store.opened and store.closed


async def test_a_failed_attempt_is_recorded_as_a_retry_with_a_delay() -> None:
    store = FakeStore()
    store.add(1, destination="http://127.0.0.1:1")
    client = ScriptedClient({"http://127.0.0.1:1/hook": 503})
    d = dispatcher(store, client)
    task = asyncio.create_task(d.run())

    await until(lambda: bool(store.rows[1].outcomes), "the outcome was never written")
    d.stop()
    await asyncio.wait_for(task, BOUND)

    (outcome,) = store.rows[1].outcomes
    assert (outcome.state, outcome.outcome, outcome.status) == ("ready", "retry", 503)
    assert outcome.delay > 0


async def test_claims_never_exceed_the_concurrency() -> None:
    store, client = FakeStore(), ScriptedClient()
    client.gate.clear()  # every request waits
    for message_id in range(1, 21):
        store.add(message_id, destination=f"http://127.0.0.{message_id}:80")
    d = dispatcher(store, client, config(concurrency=4, batch_size=10))
    task = asyncio.create_task(d.run())

    await until(lambda: client.waiting == 4, "four requests never started")
    claims_then = list(store.claims)
    await asyncio.sleep(0.2)  # polls meanwhile find no room: nothing more is claimed

    assert client.waiting == 4
    assert sum(store.claims) == 4
    assert store.claims[: len(claims_then)] == claims_then
    client.gate.set()
    await until(lambda: sum(1 for r in store.rows.values() if r.outcomes) == 20, "undelivered")
    d.stop()
    await asyncio.wait_for(task, BOUND)


@pytest.mark.slow
async def test_a_lease_lost_while_sending_ends_the_request_and_writes_nothing() -> None:
    store, client = FakeStore(), ScriptedClient()
    client.gate.clear()
    store.add(1)
    # renewed every 1.3 s, before the request's own timeout (2 s) could end it
    settings = config(
        lease=3.9,
        request_timeout=2.0,
        connect_timeout=1.0,
        statement_timeout=0.5,
        claim_timeout=1.0,
    )
    d = dispatcher(store, client, settings)
    task = asyncio.create_task(d.run())

    await until(lambda: client.waiting == 1, "the request never started")
    store.steal(1)
    await until(lambda: client.waiting == 0, "the request went on after its lease was lost")
    await until(lambda: d.in_flight == 0, "the lost message is still held")
    d.stop()
    stats = await asyncio.wait_for(task, BOUND)

    assert store.rows[1].outcomes == []  # the thief's claim is untouched
    assert (store.rows[1].owner, store.rows[1].state) == ("thief", "running")
    assert stats.lease_lost == 1


async def test_a_stop_past_the_grace_period_gives_back_what_is_still_sending() -> None:
    store, client = FakeStore(), ScriptedClient()
    client.gate.clear()  # never answers
    store.add(1)
    d = dispatcher(store, client, config(grace=0.05))
    task = asyncio.create_task(d.run())

    await until(lambda: client.waiting == 1, "the request never started")
    d.stop()
    await asyncio.wait_for(task, BOUND)

    (outcome,) = store.rows[1].outcomes
    # the request may have reached the receiver: the attempt counts, and says why
    assert (outcome.state, outcome.outcome, outcome.sent) == ("ready", "released", True)
    assert outcome.error_class == "shutdown"


async def test_claim_errors_are_retried_and_do_not_stop_the_dispatcher() -> None:
    store, client = FakeStore(), ScriptedClient()
    store.failures["claim"] = [OSError("connection refused")] * 2
    store.add(1)
    d = dispatcher(store, client)
    task = asyncio.create_task(d.run())

    await until(lambda: bool(store.rows[1].outcomes), "never delivered after the errors")
    d.stop()
    await asyncio.wait_for(task, BOUND)

    assert store.claims[0] == 1  # the first claim that answered took it
    assert store.rows[1].outcomes[0].outcome == "delivered"


async def test_a_delivery_lost_before_it_started_frees_its_request_slot() -> None:
    # never runs: only the in-memory bookkeeping of two started deliveries
    d = dispatcher(FakeStore(), ScriptedClient())
    d._start(job(id=1))
    d._start(job(id=2))
    d._lose(1, 1)  # its task is cancelled before the loop ever ran it
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert d._flights.sending == 0
    assert d.in_flight == 1  # message 2 awaits its outcome write
    assert list(d._outcomes) == [2]


async def test_messages_claimed_after_the_stop_are_released_unsent() -> None:
    store, client = FakeStore(), ScriptedClient()
    store.add(1)
    d = dispatcher(store, client)

    original = store.claim

    async def claim_then_stop(*args: object, **kwargs: object) -> object:
        result = await original(*args, **kwargs)  # type: ignore[arg-type]
        d.stop()  # the stop arrives while the claim's answer is on its way
        return result

    store.claim = claim_then_stop  # type: ignore[method-assign]
    await asyncio.wait_for(d.run(), BOUND)

    assert client.requests == []
    (outcome,) = store.rows[1].outcomes
    assert (outcome.outcome, outcome.sent, outcome.attempt) == ("released", False, 1)
