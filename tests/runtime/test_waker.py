"""Wake-ups across dispatchers: one on duty, notifications only while it waits."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg

from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from dispatchers.runtime.waker import Waker
from outbox import Outbox
from tests.dispatching import fast_config
from tests.receiver import Receiver, Reply
from tests.waiting import until


@asynccontextmanager
async def dispatchers(
    url: str, cfg: DispatcherConfig, count: int
) -> AsyncIterator[list[Dispatcher]]:
    fleet = [Dispatcher(url, cfg, log=NullLog()) for _ in range(count)]
    tasks = [asyncio.create_task(d.run()) for d in fleet]
    try:
        yield fleet
    finally:
        for d in fleet:
            d.stop()
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)


def on_duty(fleet: list[Dispatcher]) -> list[Dispatcher]:
    return [d for d in fleet if d.waker is not None and d.waker.on_duty]


def enqueue(url: str, target: str, key: str) -> None:
    with psycopg.connect(url) as conn:
        Outbox().enqueue(conn, url=target, idempotency_key=key, json={"key": key})


async def test_one_dispatcher_is_on_duty_and_another_takes_over_when_it_stops(
    database_url: str,
) -> None:
    async with dispatchers(database_url, fast_config(), 3) as fleet:
        await until(lambda: len(on_duty(fleet)) == 1, "one dispatcher on duty")
        # and it stays the only one while the others try for duty at each poll
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            assert len(on_duty(fleet)) == 1
            await asyncio.sleep(0.01)
        first = on_duty(fleet)[0]
        first.stop()
        await until(
            lambda: len(on_duty(fleet)) == 1 and first not in on_duty(fleet),
            "another dispatcher on duty",
        )


async def test_a_notification_wakes_the_dispatcher_on_duty_and_no_other(
    database_url: str,
) -> None:
    # Off duty, a dispatcher polls only every 30 s: whatever is delivered within
    # the test was claimed by the one on duty, woken by notifications.
    with Receiver() as receiver:
        async with dispatchers(database_url, fast_config(poll_interval=30.0), 3) as fleet:
            await until(
                lambda: (
                    any(d.waker and d.waker.notified for d in fleet)
                    and all(d.stats.claims for d in fleet)
                ),
                "every dispatcher started, one of them waiting for notifications",
            )
            (duty,) = on_duty(fleet)
            others = [d for d in fleet if d is not duty]
            claims = [d.stats.claims for d in others]
            for i in range(5):
                await asyncio.to_thread(enqueue, database_url, receiver.url, f"k{i}")
                await until(lambda i=i: duty.stats.delivered == i + 1, f"message {i} delivered")
            assert len(receiver.requests) == 5
            assert duty.waker is not None and duty.waker.notifications >= 5
            assert [d.stats.claims for d in others] == claims
            assert all(d.waker is not None and d.waker.notifications == 0 for d in others)


async def test_a_dispatcher_whose_slots_are_all_taken_hands_duty_to_one_with_room(
    database_url: str,
) -> None:
    # One request slot each, and no polls within the test: a message reaches a
    # receiver only through the dispatcher on duty.
    release = threading.Event()
    with Receiver() as receiver:
        receiver.responder = lambda req: (
            release.wait(20) if req.path == "/slow" else None,
            Reply(),
        )[1]
        try:
            async with dispatchers(
                database_url, fast_config(poll_interval=30.0, concurrency=1, lease=30.0), 2
            ) as fleet:
                await until(
                    lambda: len(on_duty(fleet)) == 1 and all(d.stats.claims for d in fleet),
                    "one dispatcher on duty",
                )
                (first,) = on_duty(fleet)
                await asyncio.to_thread(enqueue, database_url, receiver.url + "/slow", "slow")
                await until(lambda: first.in_flight == 1, "the slow message taken")
                (second,) = [d for d in fleet if d is not first]
                await until(lambda: on_duty(fleet) == [second], "duty handed off")
                await asyncio.to_thread(enqueue, database_url, receiver.url + "/fast", "fast")
                await until(lambda: second.stats.delivered == 1, "the fast message delivered")
                assert first.stats.delivered == 0  # still waiting for the slow receiver
                release.set()
                await until(lambda: first.stats.delivered == 1, "the slow message delivered")
        finally:
            release.set()


async def test_the_next_message_of_an_ordering_key_is_claimed_once_the_last_is_done(
    database_url: str,
) -> None:
    # Nobody announces that a successor became claimable; with no poll within the
    # test, each must be claimed because its predecessor's outcome was recorded.
    with Receiver() as receiver:
        async with dispatchers(database_url, fast_config(poll_interval=30.0), 1) as (dispatcher,):
            await until(
                lambda: bool(dispatcher.waker and dispatcher.waker.notified),
                "the dispatcher waits for notifications",
            )
            with psycopg.connect(database_url) as conn:
                for i in range(5):
                    Outbox().enqueue(
                        conn,
                        url=receiver.url,
                        idempotency_key=f"k{i}",
                        json={"i": i},
                        ordering_key="order-1",
                    )
            await until(lambda: dispatcher.stats.delivered == 5, "the chain delivered")
            assert [r.body for r in receiver.requests] == [b'{"i":%d}' % i for i in range(5)]


async def test_producers_notify_only_while_the_dispatcher_holds_the_wake_lock(
    database_url: str, observer: psycopg.Connection[Any]
) -> None:
    changes: list[tuple[bool, bool]] = []
    waker = Waker(
        database_url,
        fast_config(),
        on_notify=lambda: None,
        on_change=lambda: changes.append((waker.on_duty, waker.notified)),
        log=NullLog(),
    )
    wake_lock = Outbox().queries.wake_lock
    channel = Outbox().queries.channel

    def wake_lock_free() -> bool:
        row = observer.execute("SELECT pg_try_advisory_lock(%s, %s)", wake_lock).fetchone()
        if row and row[0]:
            observer.execute("SELECT pg_advisory_unlock(%s, %s)", wake_lock)
        return bool(row and row[0])

    task = asyncio.create_task(waker.run())
    try:
        waker.request(wake=True)
        await until(lambda: waker.on_duty and waker.notified, "waiting for notifications")
        assert not wake_lock_free()
        await asyncio.to_thread(enqueue, database_url, "https://example.com/a", "a")
        await until(lambda: waker.notifications == 1, "the enqueue's notification")

        waker.request(wake=False)  # busy: it claims on a timer now
        await until(lambda: not waker.notified, "the wake lock released")
        assert waker.on_duty
        assert wake_lock_free()
        await asyncio.to_thread(enqueue, database_url, "https://example.com/a", "b")
        # notifications arrive in commit order: once this one is in, the enqueue's
        # would have been too
        observer.execute("SELECT pg_notify(%s, 'marker')", (channel,))
        await until(lambda: waker.notifications >= 2, "the marker")
        assert waker.notifications == 2, "the enqueue notified nobody"
        assert changes == [(True, False), (True, True), (True, False)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
