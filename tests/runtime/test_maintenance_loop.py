"""The loop every maintenance service runs: a round per interval, never stopped
by an error, and after one, tried again sooner."""

from __future__ import annotations

import asyncio
import time

from dispatchers.runtime.log import NullLog
from dispatchers.runtime.maintenance import Service
from dispatchers.runtime.reporting import Reporter


class Flaky(Service):
    """Fails its first ``failures`` rounds, then records when each round ran."""

    operation = "flaky"
    wait_first = False

    def __init__(self, report: Reporter, *, interval: float, failures: int) -> None:
        super().__init__(None, report, interval=interval)  # type: ignore[arg-type]
        self.failures = failures
        self.rounds: list[float] = []
        self.done = asyncio.Event()

    async def run_once(self) -> None:
        self.rounds.append(time.monotonic())
        if len(self.rounds) <= self.failures:
            raise OSError("the database went away")
        if len(self.rounds) == self.failures + 2:
            self.done.set()


async def test_a_failed_round_is_reported_and_tried_again_before_the_interval() -> None:
    report = Reporter(NullLog())
    service = Flaky(report, interval=0.5, failures=3)
    task = asyncio.create_task(service.run())
    try:
        async with asyncio.timeout(10):
            await service.done.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    gaps = [b - a for a, b in zip(service.rounds, service.rounds[1:], strict=False)]
    assert len(gaps) == 4
    # three failures: retried after the backoff (50, 100, 200 ms at most) ...
    assert all(gap < 0.4 for gap in gaps[:3]), gaps
    # ... then a success, and the next round an interval later
    assert gaps[3] >= 0.45, gaps
    assert report.stats.db_errors == 3
