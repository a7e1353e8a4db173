"""The alerts a dispatcher raises, against a store in memory: what the lag watch
reports of a backlog read, and how often a missing key is raised from one
process (the database decides once per key and hour across all of them:
tests/library/test_alerts.py)."""

from __future__ import annotations

from dispatchers.runtime.alerts import KeyAlerts, LagWatch
from dispatchers.runtime.log import NullLog
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.rows import Backlog
from tests.runtime.fakes import FakeStore


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
