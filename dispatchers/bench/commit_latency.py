"""The ``commit-latency`` scenario: commit latency of business transactions with
one outbox row each at offered rates, paced over several connections, with and
without a dispatcher consuming."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from dispatchers.bench.committers import Committers
from dispatchers.bench.context import Bench
from dispatchers.bench.enqueue import business_tables
from dispatchers.bench.env import fresh_schema
from dispatchers.bench.measure import NoopClient, delta, per_msg_us, percentile
from dispatchers.bench.results import CommitLatencyResult, CommitLatencyRun, PacedRate
from dispatchers.runtime import loop as loops
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog


async def _wait_for(condition: Callable[[], bool], within: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``within`` seconds pass (False)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _paced_rate(bench: Bench, committers: Committers, rate: float) -> PacedRate:
    """One offered ``rate`` of business transactions with an outbox row (NOTIFY on):
    commit latency percentiles, and the CPU each transaction cost."""
    s = bench.settings
    pg0 = bench.pg_clock.read() if bench.pg_clock else None
    results = committers.run("outbox", s.commit_rate_seconds, rate=rate)
    pg_cpu = delta(bench.pg_clock.read() if bench.pg_clock else None, pg0)
    service = [ms for r in results for ms in r.service_ms]
    scheduled = [ms for r in results for ms in r.scheduled_ms]
    commits = sum(r.commits for r in results)
    per_connection = max(1, round(s.commit_rate_seconds * rate / committers.count))
    return PacedRate(
        offered_tx_per_s=rate,
        seconds=s.commit_rate_seconds,
        expected=per_connection * committers.count,
        committed=commits,
        p50_ms=percentile(service, 50),
        p99_ms=percentile(service, 99),
        max_ms=max(service) if service else None,
        p50_from_schedule_ms=percentile(scheduled, 50),
        p99_from_schedule_ms=percentile(scheduled, 99),
        producer_late_max_ms=max(r.late_max_s for r in results) * 1000,
        client_cpu_us_per_tx=per_msg_us(sum(r.cpu_s for r in results), commits),
        postgres_cpu_us_per_tx=per_msg_us(pg_cpu, commits),
    )


def commit_latency_in(bench: Bench, schema: str, *, dispatcher: bool = False) -> CommitLatencyRun:
    """Commit latency of business transactions with an outbox row (NOTIFY on) at each
    of ``commit_rates``, offered by ``commit_producers`` paced connections sharing
    the rate. With ``dispatcher``, a dispatcher (LISTEN on, no network) consumes
    the messages meanwhile, as in production; its claims and outcome writes then
    compete with the producers for PostgreSQL."""
    s = bench.settings
    failures: list[str] = []
    with Committers(bench.db.url, schema, s.commit_producers) as committers:

        def offer() -> list[PacedRate]:
            figures = []
            for rate in s.commit_rates:
                bench.progress(
                    f"commit-latency: {rate:g} tx/s for {s.commit_rate_seconds:g} s, "
                    f"dispatcher {'on' if dispatcher else 'off'}"
                )
                figures.append(_paced_rate(bench, committers, rate))
            return figures

        if dispatcher:
            rates, problems = loops.run(
                _offer_consumed(bench, schema, offer), event_loop=bench.settings.event_loop
            )
            failures += problems
        else:
            rates = offer()
    for r in rates:
        if r.committed != r.expected:
            failures.append(
                f"{r.offered_tx_per_s:g} tx/s: {r.committed} of {r.expected} "
                "transactions committed within the time bound"
            )
    return CommitLatencyRun(dispatcher=dispatcher, rates=rates, failures=failures)


async def _offer_consumed(
    bench: Bench, schema: str, offer: Callable[[], list[PacedRate]]
) -> tuple[list[PacedRate], list[str]]:
    """Run ``offer`` (in a thread) while a dispatcher consumes ``schema``; then wait
    until it has delivered every committed message."""
    s = bench.settings
    config = DispatcherConfig(
        schema=schema,
        concurrency=s.concurrency,
        batch_size=s.batch_size,
        allow_private_networks=True,
        listen=True,
    )
    dispatcher = Dispatcher(bench.db.url, config, client=NoopClient(), log=NullLog())
    task = asyncio.create_task(dispatcher.run())
    failures: list[str] = []
    try:
        waker = dispatcher.waker
        if not await _wait_for(
            lambda: bool(waker and waker.on_duty and dispatcher.stats.claims), 30
        ):
            raise RuntimeError("the dispatcher did not go on duty within 30 s")
        rates = await asyncio.to_thread(offer)
        committed = sum(r.committed for r in rates)
        if not await _wait_for(lambda: dispatcher.stats.delivered >= committed, 60):
            failures.append(
                f"dispatcher delivered {dispatcher.stats.delivered} of {committed} "
                "60 s after the last commit"
            )
        return rates, failures
    finally:
        dispatcher.stop()
        await task


def commit_latency(bench: Bench) -> CommitLatencyResult:
    """:func:`commit_latency_in` without a dispatcher, with one, or both (in fresh
    schemas), as ``commit_dispatcher`` says."""
    choice = bench.settings.commit_dispatcher
    runs = []
    for dispatcher in (False, True):
        if choice == ("on" if dispatcher else "off") or choice == "both":
            with fresh_schema(bench.db.url) as schema:
                business_tables(bench.db.url, schema)
                runs.append(commit_latency_in(bench, schema, dispatcher=dispatcher))
    failures = [
        f"dispatcher {'on' if r.dispatcher else 'off'}: {f}" for r in runs for f in r.failures
    ]
    return CommitLatencyResult(
        producers=bench.settings.commit_producers, runs=runs, ok=not failures, failures=failures
    )
