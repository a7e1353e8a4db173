"""The drain scenarios: a backlog of ``messages`` drained by the dispatcher.

- ``drain-http``: delivered to the fast receiver (its own process): messages per
  second, CPU microseconds per message of PostgreSQL, the dispatcher and the
  receiver, and database round trips per message.
- ``drain-noop``: the same with an HTTP client that answers 200 without a network
  (:class:`~dispatchers.bench.measure.NoopClient`), so only the queue machinery is
  timed.

Every drain runs in a fresh process of its own
(:class:`~dispatchers.bench.drain_process.DrainProcess`), so each reports the peak
RSS of a dispatcher doing it. With baselines, each scenario runs in rounds, ours
then each baseline's, on the same database and receiver. :func:`drain_in` is also
the history and memory scenarios' drain.
"""

from __future__ import annotations

import dataclasses
import time

from dispatchers.bench import Settings
from dispatchers.bench.baselines import pgqueuer
from dispatchers.bench.context import Bench
from dispatchers.bench.drain_process import DrainProcess
from dispatchers.bench.env import (
    CpuClock,
    bench_queries,
    connect,
    fresh_schema,
    receiver_check,
    row_counts,
    run_id,
    seed_backlog,
)
from dispatchers.bench.measure import MB, delta, median, most, per_msg_us
from dispatchers.bench.receiver_process import ReceiverProcess
from dispatchers.bench.results import (
    BaselineDrains,
    DrainResult,
    DrainRun,
    DrainSummary,
    NaiveFacts,
    PgqueuerFacts,
)

NOOP_URL = "http://127.0.0.1:9/noop"  # never connected to: the transport answers


def drain_once(
    bench: Bench,
    *,
    design: str,
    http: bool,
    messages: int,
    receiver: ReceiverProcess | None = None,
    concurrency: int | None = None,
) -> DrainRun:
    """One timed drain of ``messages`` by ``design`` ("outbox" or "naive") in a fresh
    schema."""
    with fresh_schema(bench.db.url) as schema:
        return drain_in(
            bench,
            schema,
            design=design,
            http=http,
            messages=messages,
            receiver=receiver,
            concurrency=concurrency,
        )


def drain_in(
    bench: Bench,
    schema: str,
    *,
    design: str,
    http: bool,
    messages: int,
    receiver: ReceiverProcess | None = None,
    concurrency: int | None = None,
) -> DrainRun:
    """Enqueue ``messages`` in ``schema`` and time one drain of them by ``design``
    ("outbox" or "naive") in its own process, checking that each was delivered once.

    ``receiver`` replaces the bench's shared one (with ``http``); ``concurrency``
    the dispatcher's from the settings."""
    url = bench.db.url
    settings = bench.settings
    if concurrency is not None:
        settings = dataclasses.replace(settings, concurrency=concurrency)
    if http and receiver is None:
        receiver = bench.receiver
    elif not http:
        receiver = None
    targets = receiver.urls if receiver else [NOOP_URL]
    delivered_before = row_counts(url, schema).delivered
    keys = [f"{design}-{run_id()}-{i}" for i in range(messages)]
    t0 = time.perf_counter()
    seed_backlog(url, schema, targets=targets, keys=keys)
    seed_s = time.perf_counter() - t0
    with connect(url, autocommit=True) as conn:  # fresh planner statistics, as in production
        conn.execute(bench_queries(schema)["analyze_messages"])

    before = receiver.counts() if receiver else None
    receiver_clock = CpuClock(receiver.pid) if receiver else None
    with DrainProcess(url, settings, schema, design=design, http=http) as child:
        rcpu0 = receiver_clock.read() if receiver_clock else None
        pgcpu0 = bench.pg_clock.read() if bench.pg_clock else None
        figures = child.run()
        pg_cpu = delta(bench.pg_clock.read() if bench.pg_clock else None, pgcpu0)
        receiver_cpu = delta(receiver_clock.read() if receiver_clock else None, rcpu0)
    after = receiver.counts() if receiver else None
    rows = row_counts(url, schema)
    new_rows = rows.delivered - delivered_before

    delivered = figures.delivered
    failures: list[str] = []
    if figures.timed_out:
        failures.append(f"not drained within {bench.settings.drain_timeout:g} s")
    if delivered != messages:
        failures.append(f"delivered {delivered}, expected {messages}")
    if rows.messages != 0:
        failures.append(f"{rows.messages} rows left in messages")
    if new_rows != messages:
        failures.append(f"{new_rows} new rows in delivered, expected {messages}")
    receiver_requests = duplicates = big_responses = None  # no receiver: the transport answered
    if before is not None and after is not None:
        seen, problems = receiver_check(before, after, messages)
        receiver_requests, duplicates = seen.requests, seen.duplicates
        big_responses = after["big_responses"] - before["big_responses"]
        failures += problems
    seconds = figures.seconds
    return DrainRun(
        design=design,
        messages=messages,
        history_rows=delivered_before,
        seed_s=seed_s,
        delivered=delivered,
        retried=figures.retried,
        dead=figures.dead,
        lease_lost=figures.lease_lost,
        db_errors=figures.db_errors,
        round_trips=figures.round_trips,
        claims=figures.claims,
        flushes=figures.flushes,
        timed_out=figures.timed_out,
        seconds=seconds,
        msgs_per_s=delivered / seconds if seconds > 0 else None,
        round_trips_per_msg=figures.round_trips / delivered if delivered else None,
        cpu_dispatcher_us_per_msg=per_msg_us(figures.cpu_s, delivered),
        cpu_postgres_us_per_msg=per_msg_us(pg_cpu, delivered),
        cpu_receiver_us_per_msg=per_msg_us(receiver_cpu, delivered),
        rows_in_messages=rows.messages,
        rows_in_delivered=new_rows,
        concurrency=settings.concurrency if design == "outbox" else None,
        peak_rss_mb=figures.peak_rss / MB,
        rss_growth_mb=None
        if child.rss_ready is None
        else (figures.peak_rss - child.rss_ready) / MB,
        receiver_requests=receiver_requests,
        duplicates=duplicates,
        big_responses=big_responses,
        ok=not failures,
        failures=failures,
    )


def _summary(runs: list[DrainRun]) -> DrainSummary:
    """Medians over runs of one design; memory: the worst run, not a typical one."""
    duplicates = [r.duplicates for r in runs if r.duplicates is not None]
    return DrainSummary(
        msgs_per_s=median([r.msgs_per_s for r in runs]),
        seconds=median([r.seconds for r in runs]),
        round_trips_per_msg=median([r.round_trips_per_msg for r in runs]),
        cpu_dispatcher_us_per_msg=median([r.cpu_dispatcher_us_per_msg for r in runs]),
        cpu_postgres_us_per_msg=median([r.cpu_postgres_us_per_msg for r in runs]),
        cpu_receiver_us_per_msg=median([r.cpu_receiver_us_per_msg for r in runs]),
        peak_rss_mb=most([r.peak_rss_mb for r in runs]),
        rss_growth_mb=most([r.rss_growth_mb for r in runs]),
        delivered=sum(r.delivered for r in runs),
        messages=sum(r.messages for r in runs),
        duplicates=sum(duplicates) if duplicates else None,
    )


def _baseline_drain(bench: Bench, baseline: str, *, http: bool) -> DrainRun:
    """One timed drain of ``messages`` by the ``baseline`` design."""
    s = bench.settings
    if baseline == "pgqueuer":
        return pgqueuer.drain(
            bench.db.url,
            messages=s.messages,
            receiver=bench.receiver if http else None,
            pg_clock=bench.pg_clock,
            concurrency=s.concurrency,
            timeout=s.drain_timeout,
        )
    return drain_once(bench, design="naive", http=http, messages=s.messages)


def _baseline_facts(settings: Settings, baseline: str) -> NaiveFacts | PgqueuerFacts:
    """How the ``baseline`` design was configured, for the report."""
    if baseline == "pgqueuer":
        return PgqueuerFacts(
            name="pgqueuer",
            version=pgqueuer.version(),
            managers=pgqueuer.DRAIN_MANAGERS,
            batch_size=pgqueuer.BATCH_SIZE,
        )
    return NaiveFacts(name="naive", workers=settings.naive_workers)


def require_baselines(settings: Settings) -> None:
    """Refuse to start when a baseline's packages are missing (say which)."""
    if "pgqueuer" in settings.baselines and (reason := pgqueuer.available()):
        raise RuntimeError(f"--baseline pgqueuer: {reason}")


def _msgs_ratio(ours: DrainRun, theirs: DrainRun) -> float | None:
    if ours.msgs_per_s and theirs.msgs_per_s:
        return ours.msgs_per_s / theirs.msgs_per_s
    return None


def drain_scenario(bench: Bench, name: str, *, http: bool) -> DrainResult:
    """drain-http or drain-noop: ``repeat`` runs, or ``pairs`` rounds of ours and
    each baseline's, interleaved."""
    s = bench.settings
    ours: list[DrainRun] = []
    theirs: dict[str, list[DrainRun]] = {b: [] for b in s.baselines}
    if s.baselines:
        require_baselines(s)
        for i in range(s.pairs):
            bench.progress(f"{name}: round {i + 1}/{s.pairs}: outbox dispatcher")
            ours.append(drain_once(bench, design="outbox", http=http, messages=s.messages))
            for baseline, runs in theirs.items():
                bench.progress(f"{name}: round {i + 1}/{s.pairs}: {baseline} baseline")
                runs.append(_baseline_drain(bench, baseline, http=http))
    else:
        for i in range(s.repeat):
            bench.progress(f"{name}: run {i + 1}/{s.repeat}")
            ours.append(drain_once(bench, design="outbox", http=http, messages=s.messages))
    baselines = []
    for baseline, runs in theirs.items():
        ratios = [_msgs_ratio(a, b) for a, b in zip(ours, runs, strict=True)]
        baselines.append(
            BaselineDrains(
                facts=_baseline_facts(s, baseline),
                summary=_summary(runs),
                runs=runs,
                ratios=ratios,
                median_ratio=median(list(ratios)),
            )
        )
    every = ours + [r for runs in theirs.values() for r in runs]
    failures = [f"{r.design} run: {f}" for r in every for f in r.failures]
    return DrainResult(
        concurrency=s.concurrency,
        batch_size=s.batch_size,
        destinations=s.destinations if http else 1,
        summary=_summary(ours),
        runs=ours,
        baselines=baselines,
        ok=not failures,
        failures=failures,
    )


def drain_http(bench: Bench) -> DrainResult:
    return drain_scenario(bench, "drain-http", http=True)


def drain_noop(bench: Bench) -> DrainResult:
    return drain_scenario(bench, "drain-noop", http=False)
