"""Policies of plain destinations hold across dispatcher processes: a rate limit,
measured by the receiver's arrival times, and a concurrency cap, counted by the
receiver. Each receiver listens on its own port: its own origin, its own
destination."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from dispatchers.delivery.jobs import Job
from dispatchers.store.messages import Completion
from dispatchers.store.postgres import Store
from outbox import Destinations, Outbox
from outbox.endpoints import Endpoints
from tests.dispatching import delivered, fast_config
from tests.processes import Fleet, scalar
from tests.receiver import ConcurrencyMeter, Receiver

RELAXED = ("--request-timeout", "10", "--connect-timeout", "5", "--lease", "30")
JITTER = 0.5
"""Seconds by which the arrival of a request may trail its claim's rate slot: a
dispatcher starved of CPU for a moment sends what it claimed meanwhile at once
(10 requests at this test's rate; a limiter that granted fresh bursts would send
the 140 in a few windows)."""


def enqueue(database_url: str, url: str, count: int) -> None:
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        for i in range(count):
            box.enqueue(conn, url=url, idempotency_key=f"{url}-{i}", json={"i": i})


def drain_with_two_processes(database_url: str, fleet: Fleet) -> None:
    procs = [
        fleet.start(
            database_url, *RELAXED, "--concurrency", "16", "--allow-private-networks", "--drain"
        )
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.wait(timeout=60) == 0, proc.describe()


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_a_rate_limit_holds_within_10_percent_across_two_dispatcher_processes(
    database_url: str, tmp_path: Path
) -> None:
    rate, burst, count = 20.0, 2, 140
    with Receiver() as receiver, Fleet(tmp_path) as fleet:
        with psycopg.connect(database_url) as conn:
            policy = Destinations().set(
                conn, receiver.url + "/any/path", rate_limit=rate, burst=burst
            )
        assert policy.destination == receiver.url  # the origin of the URL given
        enqueue(database_url, receiver.url + "/limited", count)
        drain_with_two_processes(database_url, fleet)
        arrivals = sorted(r.at for r in receiver.requests)
    assert len(arrivals) == count
    # after the first burst, the rest arrive at the limit: (count - burst) requests
    # over the span from the first to the last of them, one slot period before it
    steady = arrivals[burst:]
    measured = (len(steady) - 1) / (steady[-1] - steady[0])
    assert rate * 0.9 <= measured <= rate * 1.1, measured
    # and in every window, not only on average: from any arrival to any later one,
    # at most the burst plus the rate times the window, with JITTER for the time
    # between a claim taking its slot and its request arriving (it varies)
    for i, first in enumerate(arrivals):
        for j in range(i + 1, len(arrivals)):
            span = arrivals[j] - first
            assert j - i + 1 <= burst + rate * (span + JITTER), (i, j, span)


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_a_plain_destinations_cap_holds_across_two_dispatcher_processes(
    database_url: str, tmp_path: Path
) -> None:
    meter = ConcurrencyMeter(delay=0.05)
    with Receiver(meter) as capped, Receiver(meter) as free, Fleet(tmp_path) as fleet:
        with psycopg.connect(database_url) as conn:
            Destinations().set(conn, capped.url, max_concurrency=3)
        enqueue(database_url, capped.url + "/capped", 120)
        enqueue(database_url, free.url + "/free", 120)
        drain_with_two_processes(database_url, fleet)
    assert scalar(database_url, "SELECT count(*) FROM outbox.delivered") == 240
    held = "SELECT count(*) FROM outbox.destination_slots WHERE message_id IS NOT NULL"
    assert scalar(database_url, held) == 0  # every slot is free again
    assert meter.peak["/capped"] == 3  # reached, never exceeded
    assert meter.peak["/free"] > 3  # the other destination was not held back


async def test_a_claim_takes_a_slot_of_each_kind_which_release_and_rescue_free(
    database_url: str,
) -> None:
    box = Outbox()
    with psycopg.connect(database_url) as conn:
        # an endpoint limited to 1/s with a burst of 2; an origin capped at 2
        Endpoints().add(conn, url="https://hooks.example/in", rate_limit=1, burst=2)
        Destinations().set(conn, "https://capped.example", max_concurrency=2)
        webhooks = [box.publish(conn, "tick", {"i": i})[0] for i in range(4)]
        capped = [
            box.enqueue(conn, url="https://capped.example/x", idempotency_key=f"c{i}", json={})
            for i in range(4)
        ]
        free = [
            box.enqueue(conn, url="https://free.example/x", idempotency_key=f"f{i}", json={})
            for i in range(3)
        ]
    store = Store(database_url, fast_config(destination_concurrency=100))
    await store.open()
    try:
        claim = await store.claim("owner", 20)
        jobs = {job.id: job for job in claim.messages}
        assert set(jobs) == {*webhooks[:2], *capped[:2], *free}
        # both rate slots were just taken: the next frees burst / rate = 2 s on
        assert claim.rate_wait is not None and 1.5 < claim.rate_wait <= 2.0
        assert (await store.claim("owner", 20)).messages == []  # the limit and the cap hold
        done = jobs[capped[0]]
        released = Completion(done.id, done.attempts, "ready", "released", sent=False)
        assert (await store.complete("owner", [released]))[0] == {done.id}
        # its slot is free again: the next due message of that origin takes it
        assert [job.id for job in (await store.claim("owner", 20)).messages] == [capped[2]]
        # so is the slot of a message whose lease expired, once it is rescued
        with psycopg.connect(database_url) as conn:
            conn.execute(
                "UPDATE outbox.messages SET lease_until = now() - interval '1 second'"
                " WHERE id = %s",
                (capped[1],),
            )
        assert await store.rescue() == [(capped[1], "ready")]
        assert [job.id for job in (await store.claim("owner", 20)).messages] == [capped[3]]
    finally:
        await store.close()


async def test_lowering_a_cap_below_the_requests_in_flight_starts_none_until_under_it(
    database_url: str,
) -> None:
    box = Outbox()
    origin = "https://capped.example"
    with psycopg.connect(database_url) as conn:
        Destinations().set(conn, origin, max_concurrency=5)
        for i in range(9):
            box.enqueue(conn, url=f"{origin}/x", idempotency_key=f"c{i}", json={})
    store = Store(database_url, fast_config(destination_concurrency=100))
    await store.open()

    async def finish(job: Job) -> None:
        assert (await store.complete("owner", [delivered(job.id, job.attempts)]))[0] == {job.id}

    try:
        flying = (await store.claim("owner", 20)).messages
        assert len(flying) == 5
        for job in flying[:2]:  # two finish: three still in flight
            await finish(job)
        flying = flying[2:]
        with psycopg.connect(database_url) as conn:
            Destinations().set(conn, origin, max_concurrency=2)
        assert (await store.claim("owner", 20)).messages == []  # 3 in flight against a cap of 2
        await finish(flying.pop())
        assert (await store.claim("owner", 20)).messages == []  # 2 in flight: at the cap
        await finish(flying.pop())
        (taken,) = (await store.claim("owner", 20)).messages  # 1 in flight: one may start
        flying.append(taken)
        assert (await store.claim("owner", 20)).messages == []
        # raised again: the new slots are free at once, the held ones stay held
        with psycopg.connect(database_url) as conn:
            Destinations().set(conn, origin, max_concurrency=5)
        assert len((await store.claim("owner", 20)).messages) == 3
        assert (
            scalar(
                database_url,
                "SELECT count(*) FROM outbox.destination_slots"
                " WHERE destination = %s AND message_id IS NULL",
                (origin,),
            )
            == 0
        )
    finally:
        await store.close()


async def _in_flight_never_passes_the_cap(
    database_url: str, store: Store, flying: list[Job], cap: int
) -> None:
    """Finish ``flying`` one at a time; after each, a claim starts a request only
    while fewer than ``cap`` are in flight; at the end the slots are the cap, free,
    and no request waits for one."""
    while flying:
        job = flying.pop(0)
        assert (await store.complete("owner", [delivered(job.id, job.attempts)]))[0] == {job.id}
        ready = scalar(database_url, "SELECT count(*) FROM outbox.messages WHERE state = 'ready'")
        started = (await store.claim("owner", 20)).messages
        # as many as the cap leaves room for, and none while it is full
        assert len(started) == min(ready, max(0, cap - len(flying))), (flying, started)
        flying += started
    assert scalar(database_url, "SELECT count(*) FROM outbox.messages") == 0  # all delivered
    slots = "SELECT count(*) FROM outbox.destination_slots WHERE message_id IS NULL"
    assert scalar(database_url, slots) == cap  # the test's only destination
    assert scalar(database_url, "SELECT count(*) FROM outbox.unseated_requests") == 0


async def test_no_claim_starts_while_the_cap_is_full_after_it_is_lowered_below_every_free_slot(
    database_url: str,
) -> None:
    """The holders of the slots a lowered cap deletes, with no free slot left to
    move to, still count: each slot freed passes to one of them."""
    box = Outbox()
    origin = "https://lowered.example"
    with psycopg.connect(database_url) as conn:
        Destinations().set(conn, origin, max_concurrency=3)
        for i in range(6):
            box.enqueue(conn, url=f"{origin}/x", idempotency_key=f"l{i}", json={})
    store = Store(database_url, fast_config(destination_concurrency=100))
    await store.open()
    try:
        flying = (await store.claim("owner", 20)).messages
        assert len(flying) == 3  # every slot held
        with psycopg.connect(database_url) as conn:
            Destinations().set(conn, origin, max_concurrency=1)
        assert (await store.claim("owner", 20)).messages == []
        assert scalar(database_url, "SELECT count(*) FROM outbox.unseated_requests") == 2
        await _in_flight_never_passes_the_cap(database_url, store, flying, cap=1)
    finally:
        await store.close()


async def test_no_claim_starts_while_the_cap_is_full_after_it_is_set_on_requests_in_flight(
    database_url: str,
) -> None:
    """Requests claimed before their destination had a cap count against the cap
    once it is set."""
    box = Outbox()
    origin = "https://newly-capped.example"
    with psycopg.connect(database_url) as conn:
        for i in range(7):
            box.enqueue(conn, url=f"{origin}/x", idempotency_key=f"n{i}", json={})
    store = Store(database_url, fast_config(destination_concurrency=100))
    await store.open()
    try:
        flying = (await store.claim("owner", 3)).messages
        assert len(flying) == 3  # no cap yet
        with psycopg.connect(database_url) as conn:
            Destinations().set(conn, origin, max_concurrency=2)
        assert (await store.claim("owner", 20)).messages == []
        await _in_flight_never_passes_the_cap(database_url, store, flying, cap=2)
    finally:
        await store.close()
