"""Fair claiming across destinations: a deep or slow backlog at one destination
does not hold another's messages back, a hanging one holds no more than its bound
of request slots, and ordering keys keep their order across destinations.

Each receiver listens on its own port of 127.0.0.1: to the dispatcher, its own
origin, so its own destination."""

from __future__ import annotations

import threading
import time

import pytest

from dispatchers.store.postgres import Store
from tests.database import Db
from tests.dispatching import drain, fast_config, running, wait_until
from tests.receiver import Received, Receiver, Reply
from tests.timing import LATE


@pytest.fixture
def db(database_url: str) -> Db:
    return Db(database_url)


class Holding:
    """A responder that holds every request until :meth:`release` (or
    ``seconds``), counting the requests it holds at once and the most it held."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.held = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._released = threading.Event()

    def __call__(self, req: Received) -> Reply:
        with self._lock:
            self.held += 1
            self.peak = max(self.peak, self.held)
        self._released.wait(self.seconds)
        with self._lock:
            self.held -= 1
        return Reply()

    def release(self) -> None:
        self._released.set()


@pytest.mark.slow
async def test_a_slow_destinations_backlog_does_not_hold_another_back(db: Db) -> None:
    # 200 messages to a destination answering after 1 s, then 10 to a healthy one,
    # 16 request slots: claimed in (available_at, id) order alone, the healthy
    # ones would wait for the slow backlog, about 200 / 16 s
    slow_reply = Reply(delay=1.0)
    with Receiver(lambda req: slow_reply) as slow, Receiver() as healthy:
        for i in range(200):
            db.enqueue(f"slow-{i}", slow.url)
        for i in range(10):
            db.enqueue(f"healthy-{i}", healthy.url)
        config = fast_config(
            concurrency=16, destination_concurrency=None, request_timeout=2.0, lease=5.0, grace=0
        )
        started = time.monotonic()
        async with running(db, config):
            await wait_until(lambda: len(healthy.requests) >= 10, seconds=30.0)
            waited = time.monotonic() - started
    # about one slow request (1 s) after the dispatcher starts, with the suite's
    # slack for a loaded machine; before fair claims it was about 12 s
    assert waited < 1.0 + LATE, f"the healthy destination's messages took {waited:.1f} s"
    assert sorted(r.headers["idempotency-key"] for r in healthy.requests) == sorted(
        f'"healthy-{i}"' for i in range(10)
    )


async def test_a_hanging_destination_holds_no_more_than_its_bound(db: Db) -> None:
    # every request slot but the bound's stays free for the other destination,
    # which is delivered while the hanging one holds its requests
    holding = Holding(seconds=30.0)
    with Receiver(holding) as hanging, Receiver() as healthy:
        for i in range(20):
            db.enqueue(f"hang-{i}", hanging.url)
        for i in range(12):
            db.enqueue(f"healthy-{i}", healthy.url)
        config = fast_config(
            concurrency=8, destination_concurrency=3, request_timeout=20.0, lease=35.0, grace=0
        )
        try:
            async with running(db, config):
                await wait_until(lambda: len(healthy.requests) >= 12 and holding.held == 3)
        finally:
            holding.release()
    # the bound was reached and never passed, while the other destination was served
    assert holding.peak == 3
    assert len(healthy.requests) == 12


@pytest.mark.slow
async def test_an_ordering_key_keeps_its_order_across_destinations(db: Db) -> None:
    with Receiver() as first, Receiver() as second:
        receivers = (first, second)
        for i in range(8):
            db.enqueue(f"ordered-{i}", receivers[i % 2].url, ordering_key="account-1")
        for i in range(8):  # unordered traffic beside it, to both destinations
            db.enqueue(f"free-{i}", receivers[i % 2].url)
        await drain(db, fast_config())
    arrived = sorted(first.requests + second.requests, key=lambda r: r.at)
    ordered = [
        r.headers["idempotency-key"] for r in arrived if "ordered" in r.headers["idempotency-key"]
    ]
    assert ordered == [f'"ordered-{i}"' for i in range(8)]


async def test_a_claim_takes_every_destinations_first_and_fills_up_from_the_deep_one(
    db: Db,
) -> None:
    # four destinations share a batch of 20: five each at first, then the one
    # with more due fills the rest of the batch
    deep = [db.enqueue(f"deep-{i}", "https://deep.example/x") for i in range(30)]
    shallow = [db.enqueue(f"shallow-{i}", f"https://shallow-{i}.example/x") for i in range(3)]
    store = Store(db.url, fast_config(destination_concurrency=100))
    await store.open()
    try:
        claimed = {job.id for job in (await store.claim("owner", 20)).messages}
    finally:
        await store.close()
    assert claimed == set(shallow) | set(deep[:17])


async def test_a_destination_alone_below_its_bound_takes_the_whole_batch(db: Db) -> None:
    # alone with ready messages, a destination below its bound gets the batch,
    # past the bound (no other destination needs the room); at its bound, or
    # beside another, it gets no more than its room. Whether the claim is told
    # that it was alone last time or not.
    alone = [db.enqueue(f"alone-{i}", "https://alone.example/x") for i in range(12)]
    destination = "https://alone.example:443"
    store = Store(db.url, fast_config(destination_concurrency=3))
    await store.open()
    try:
        claimed = [job.id for job in (await store.claim("owner", 4, {destination: 2})).messages]
        assert claimed == alone[:4]
        claimed = [
            job.id
            for job in (await store.claim("owner", 4, {destination: 2}, destination)).messages
        ]
        assert claimed == alone[4:8]
        assert (await store.claim("owner", 8, {destination: 3})).messages == []
        assert (await store.claim("owner", 8, {destination: 3}, destination)).messages == []
        other = db.enqueue("other", "https://other.example/x")
        claimed = [
            job.id
            for job in (await store.claim("owner", 8, {destination: 2}, destination)).messages
        ]
        assert claimed == [alone[8], other]
    finally:
        await store.close()
