"""The alerts a dispatcher raises, against a store in memory: what the lag watch
reports of a backlog read, and how often a missing key is raised from one
process (the database decides once per key and hour across all of them:
tests/library/test_alerts.py)."""

from __future__ import annotations

import asyncio
import io
import json

from dispatchers.runtime.alerts import KeyAlerts, LagWatch
from dispatchers.runtime.log import EventLog, NullLog
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.rows import Backlog
from tests.runtime.fakes import FakeStore
from tests.timing import LATE


async def test_the_lag_reported_is_the_longest_wait_of_the_read_with_its_destination() -> None:
    store = FakeStore()
    watch = LagWatch(store, Reporter(NullLog()), threshold=300.0)
    await watch.observed([Backlog("endpoint:1", 3, 12.5), Backlog(None, 40, 900.0)])
    await watch.observed([Backlog("endpoint:2", 1, -0.2)])  # due a moment after now()
    await watch.observed([])
    assert store.lag_reports == [
        (900.0, 300.0, None),
        (0.0, 300.0, "endpoint:2"),
        (0.0, 300.0, None),
    ]


async def test_a_missing_key_is_raised_once_an_hour_and_again_after_a_failure() -> None:
    store = FakeStore()
    now = [7200.0]
    report = Reporter(NullLog())
    alerts = KeyAlerts(store, report, owner="host:1:x", clock=lambda: now[0])

    alerts.missing(["k1", "k2"], 7)
    alerts.missing(["k1"], 8)  # while the first is being raised too
    await alerts.settle()
    assert store.key_alerts == [("k1", 7), ("k2", 7)]

    now[0] += 3599.0
    alerts.missing(["k1"], 7)
    await alerts.settle()
    assert len(store.key_alerts) == 2  # the same hour

    now[0] += 1.0
    store.failures["alert_unknown_key"] = [OSError("the database went away")]
    alerts.missing(["k1"], 7)
    await alerts.settle()
    assert report.stats.db_errors == 1
    alerts.missing(["k1"], 7)  # not raised: tried again at the next message
    await alerts.settle()
    assert store.key_alerts[2:] == [("k1", 7)]


class HungStore(FakeStore):
    """A store whose alerts never answer: each waits until it is cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = 0

    async def alert_unknown_key(
        self, key_id: str, endpoint_id: int | None, dispatcher: str
    ) -> list[int]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("never answered")


async def test_a_hung_alert_holds_the_shutdown_no_longer_than_its_bound_then_is_cancelled() -> None:
    store = HungStore()
    out = io.StringIO()
    alerts = KeyAlerts(store, Reporter(EventLog(stream=out, format="json")), owner="host:1:x")
    alerts.missing(["k-2026"], 7)
    settling = asyncio.create_task(alerts.settle(within=0.2))
    try:
        await asyncio.wait([settling], timeout=0.2 + LATE)  # which cancels nothing
        assert settling.done(), "the shutdown waited past its bound for an alert"
    finally:
        settling.cancel()
        async with asyncio.timeout(LATE):
            await asyncio.gather(settling, return_exceptions=True)
    assert store.cancelled == 1
    (event,) = (json.loads(line) for line in out.getvalue().splitlines())
    del event["ts"]
    assert event == {
        "level": "warning",
        "event": "shutdown_abandoned",
        "operation": "alert",
        "count": 1,
        "waited_s": 0.2,
    }
