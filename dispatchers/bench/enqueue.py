"""The ``enqueue`` scenario: what an outbox row costs the application.

The time of ``enqueue`` inside an open transaction, with and without NOTIFY; then
the commit throughput of business transactions with one outbox row each against
the same transactions without it and with the floor (one payload row in a table
keyed by a bigint identity), at each count of connections
(:mod:`dispatchers.bench.committers` plays the application).
"""

from __future__ import annotations

import statistics
import time

from dispatchers.bench.committers import MODES, TARGET, Committers
from dispatchers.bench.context import Bench
from dispatchers.bench.env import bench_queries, connect, fresh_schema, payload, row_counts, run_id
from dispatchers.bench.measure import delta, per_msg_us, percentile
from dispatchers.bench.results import EnqueueResult, EnqueueTiming, Throughput
from outbox import Outbox


def _enqueue_timing(url: str, *, count: int, batch: int, notify: bool) -> EnqueueTiming:
    """Time ``count`` enqueues inside open transactions committed every ``batch``."""
    with fresh_schema(url) as schema, connect(url) as conn:
        box = Outbox(schema=schema, notify=notify)
        prefix = f"enqueue-{run_id()}-"
        for i in range(min(200, count)):  # connection and statement caches; not kept
            box.enqueue(conn, url=TARGET, idempotency_key=f"{prefix}w{i}", json=payload(i))
        conn.rollback()
        clock = time.perf_counter_ns
        times_ns = [0] * count
        commits_ns: list[int] = []
        started = clock()
        for i in range(count):
            t0 = clock()
            box.enqueue(conn, url=TARGET, idempotency_key=f"{prefix}{i}", json=payload(i))
            times_ns[i] = clock() - t0
            if (i + 1) % batch == 0 or i + 1 == count:
                t0 = clock()
                conn.commit()
                commits_ns.append(clock() - t0)
        wall = (clock() - started) / 1e9
        stored = row_counts(url, schema).messages
    times_ms = [t / 1e6 for t in times_ns]
    return EnqueueTiming(
        notify=notify,
        count=count,
        median_ms=statistics.median(times_ms),
        p99_ms=percentile(times_ms, 99),
        commit_mean_ms=statistics.fmean(commits_ns) / 1e6,
        enqueues_per_s=count / wall if wall > 0 else None,
        stored=stored,
    )


def _throughput_at(bench: Bench, schema: str, workers: int) -> Throughput:
    """Commit throughput of ``workers`` business connections in every mode of
    :data:`~dispatchers.bench.committers.MODES`, the modes alternating for
    ``commit_rounds`` rounds so that other load on the machine falls on all alike."""
    s = bench.settings
    commits = dict.fromkeys(MODES, 0)
    client_cpu = dict.fromkeys(MODES, 0.0)
    pg_cpu: dict[str, float | None] = dict.fromkeys(MODES, 0.0)
    with Committers(bench.db.url, schema, workers) as committers:
        for _ in range(s.commit_rounds):
            for mode in MODES:
                pg0 = bench.pg_clock.read() if bench.pg_clock else None
                results = committers.run(mode, s.commit_seconds)
                spent = delta(bench.pg_clock.read() if bench.pg_clock else None, pg0)
                commits[mode] += sum(r.commits for r in results)
                client_cpu[mode] += sum(r.cpu_s for r in results)
                total = pg_cpu[mode]
                pg_cpu[mode] = None if spent is None or total is None else total + spent
    seconds = s.commit_rounds * s.commit_seconds
    rates = {mode: commits[mode] / seconds for mode in MODES}

    def share(mode: str, of: str) -> float | None:
        return rates[mode] / rates[of] if rates[of] else None

    notify_share = share("outbox", "outbox-no-notify")
    return Throughput(
        workers=workers,
        seconds_per_mode=seconds,
        plain_tx_per_s=rates["plain"],
        floor_tx_per_s=rates["floor"],
        outbox_tx_per_s=rates["outbox"],
        outbox_no_notify_tx_per_s=rates["outbox-no-notify"],
        ratio=share("outbox", "plain"),
        ratio_no_notify=share("outbox-no-notify", "plain"),
        floor_ratio=share("floor", "plain"),
        outbox_to_floor=share("outbox", "floor"),
        outbox_no_notify_to_floor=share("outbox-no-notify", "floor"),
        notify_cost=None if notify_share is None else 1 - notify_share,
        # PostgreSQL's CPU: each phase starts 0.2 s after the clock, idle then
        client_cpu_us_per_tx={m: per_msg_us(client_cpu[m], commits[m]) for m in MODES},
        postgres_cpu_us_per_tx={m: per_msg_us(pg_cpu[m], commits[m]) for m in MODES},
    )


def business_tables(url: str, schema: str) -> None:
    """Create the application's table and the floor's table in ``schema``."""
    with connect(url, autocommit=True) as conn:
        conn.execute(bench_queries(schema)["business_table"])
        conn.execute(bench_queries(schema)["floor_table"])


def _commit_throughput(bench: Bench) -> list[Throughput]:
    """:func:`_throughput_at` for each count of ``commit_workers``."""
    results = []
    with fresh_schema(bench.db.url) as schema:
        business_tables(bench.db.url, schema)
        for workers in bench.settings.commit_workers:
            bench.progress(
                f"enqueue: commit throughput, {workers} connections, "
                f"{bench.settings.commit_rounds} x {bench.settings.commit_seconds:g} s per mode"
            )
            results.append(_throughput_at(bench, schema, workers))
    return results


def enqueue(bench: Bench) -> EnqueueResult:
    s = bench.settings
    failures: list[str] = []
    timings = {}
    for notify in (False, True):
        bench.progress(f"enqueue: {s.enqueue_count:,} enqueues, NOTIFY {'on' if notify else 'off'}")
        timing = _enqueue_timing(
            bench.db.url, count=s.enqueue_count, batch=s.enqueue_batch, notify=notify
        )
        if timing.stored != s.enqueue_count:
            failures.append(f"{timing.stored} messages stored, expected {s.enqueue_count}")
        timings[notify] = timing
    throughput = _commit_throughput(bench)
    for t in throughput:
        if not all(
            (t.plain_tx_per_s, t.floor_tx_per_s, t.outbox_tx_per_s, t.outbox_no_notify_tx_per_s)
        ):
            failures.append(f"{t.workers} connections: a mode committed no transaction")
    return EnqueueResult(
        batch=s.enqueue_batch,
        no_notify=timings[False],
        notify=timings[True],
        commit_throughput=throughput,
        ok=not failures,
        failures=failures,
    )
