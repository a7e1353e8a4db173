"""The scenarios of ``outbox bench``: each bounded in time and count, each in a fresh
schema that is dropped afterwards, all traffic to 127.0.0.1.

- ``drain-http``: a backlog of ``messages`` delivered to the fast receiver (its own
  process): messages per second, CPU microseconds per message of PostgreSQL, the
  dispatcher and the receiver, and database round trips per message.
- ``drain-noop``: the same with an HTTP client that answers 200 without a network
  (:class:`NoopClient`), so only the queue machinery is timed.
- ``latency``: a steady offered load, enqueued by another process one message per
  committed transaction, with a dispatcher running (LISTEN on): percentiles of the
  time from commit to the receiver seeing the request.
- ``enqueue``: time of ``enqueue`` inside an open transaction, with and without
  NOTIFY; commit throughput of business transactions with one outbox row each
  against the same transactions without it and with the floor (one payload row in
  a table keyed by a bigint identity), at each count of connections.
- ``commit-latency``: commit latency of business transactions with one outbox row
  each at offered rates, paced over several connections, with and without a
  dispatcher consuming.
- ``history``: drain-noop with a large delivered history against an empty one.

With the naive baseline (:mod:`dispatchers.bench.naive`), each drain scenario runs
as pairs, ours then the baseline's, on the same database and receiver.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from psycopg import sql

from dispatchers.bench import Settings
from dispatchers.bench.committers import MODES, Committers
from dispatchers.bench.env import (
    CpuClock,
    Database,
    bench_queries,
    connect,
    fresh_schema,
    payload,
    postgres_clock,
    run_id,
    seed_backlog,
    table_counts,
)
from dispatchers.bench.naive import NaiveStats, run_naive
from dispatchers.bench.receiver import ReceiverProcess
from dispatchers.config import DispatcherConfig
from dispatchers.log import NullLog
from dispatchers.pool import Dispatcher
from outbox import Outbox

NOOP_URL = "http://127.0.0.1:9/noop"  # never connected to: the transport answers
ENQUEUE_URL = "http://127.0.0.1:9/orders"  # never sent: nothing dispatches there
SPAWN = multiprocessing.get_context("spawn")


class Bench:
    """What the scenarios share: the database, PostgreSQL's CPU clock, one receiver
    (started on first use; :meth:`close` always ends it) and the progress log."""

    def __init__(self, db: Database, settings: Settings, progress: Callable[[str], None]) -> None:
        self.db = db
        self.settings = settings
        self.progress = progress
        self.pg_clock = postgres_clock(db.url)
        self._receiver: ReceiverProcess | None = None

    @property
    def receiver(self) -> ReceiverProcess:
        if self._receiver is None:
            receiver = ReceiverProcess()
            try:
                receiver.start()
            except BaseException:
                receiver.kill()
                raise
            self._receiver = receiver
        return self._receiver

    def close(self) -> None:
        if self._receiver is not None:
            self._receiver.kill()
            self._receiver = None


# -- small helpers ----------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values`` by linear interpolation."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _delta(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None else after - before


def _per_msg_us(seconds: float | None, delivered: int) -> float | None:
    return None if seconds is None or not delivered else seconds * 1e6 / delivered


class NoopClient:
    """An :class:`~dispatchers.http.HttpClient` that answers 200 to every request
    without a network, and counts the requests."""

    def __init__(self) -> None:
        self.requests = 0

    async def request(
        self, method: str, url: str, *, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, Mapping[str, str], bytes]:
        self.requests += 1
        return 200, {}, b""

    async def aclose(self) -> None:
        return None


def analyze(url: str, schema: str) -> None:
    """Fresh planner statistics for the outbox tables (as autovacuum would give)."""
    with connect(url, autocommit=True) as conn:
        for table in ("messages", "message_keys", "delivered", "attempts"):
            conn.execute(
                sql.SQL("ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
            )


# -- drains -------------------------------------------------------------------------


async def _drain_ours(bench: Bench, schema: str, http: bool) -> dict[str, Any]:
    s = bench.settings
    config = DispatcherConfig(
        schema=schema,
        concurrency=s.concurrency,
        batch_size=s.batch_size,
        allow_private_networks=True,
        http_client=s.http_client or DispatcherConfig.http_client,
    )
    client = None if http else NoopClient()
    dispatcher = Dispatcher(bench.db.url, config, client=client, log=NullLog())
    timed_out = False
    try:
        async with asyncio.timeout(s.drain_timeout):
            await dispatcher.run(drain=True)
    except TimeoutError:
        timed_out = True
    st = dispatcher.stats
    return {
        "delivered": st.delivered,
        "retried": st.retried,
        "dead": st.dead,
        "lease_lost": st.lease_lost,
        "db_errors": st.db_errors,
        "round_trips": st.round_trips,
        "claims": st.claims,
        "flushes": st.flushes,
        "timed_out": timed_out,
    }


async def _drain_naive(bench: Bench, schema: str, http: bool) -> dict[str, Any]:
    s = bench.settings
    stats = NaiveStats()
    timed_out = False
    try:
        async with asyncio.timeout(s.drain_timeout):
            await run_naive(bench.db.url, schema, workers=s.naive_workers, http=http, stats=stats)
    except TimeoutError:
        timed_out = True
    return {
        "delivered": stats.delivered,
        "retried": stats.retried,
        "round_trips": stats.round_trips,
        "claims": stats.claims,
        "timed_out": timed_out,
    }


def seed_history(bench: Bench, schema: str, *, rows: int, target: str) -> float:
    """Write a delivered history of ``rows`` messages to ``schema``, then ANALYZE the
    tables; return the seconds it took."""
    started = time.perf_counter()
    with connect(bench.db.url, autocommit=True) as conn:
        conn.execute(
            bench_queries(schema)["seed_history"],
            {"rows": rows, "target": target, "body": json.dumps(payload(0)).encode()},
        )
    analyze(bench.db.url, schema)
    return time.perf_counter() - started


def drain_once(bench: Bench, *, design: str, http: bool, messages: int) -> dict[str, Any]:
    """One timed drain of ``messages`` by ``design`` ("outbox" or "naive") in a fresh
    schema."""
    with fresh_schema(bench.db.url) as schema:
        return drain_in(bench, schema, design=design, http=http, messages=messages)


def drain_in(
    bench: Bench, schema: str, *, design: str, http: bool, messages: int
) -> dict[str, Any]:
    """Enqueue ``messages`` in ``schema`` and time one drain of them by ``design``
    ("outbox" or "naive"), checking that each was delivered once."""
    url = bench.db.url
    receiver = bench.receiver if http else None
    target = receiver.url if receiver else NOOP_URL
    result: dict[str, Any] = {"design": design, "messages": messages}
    delivered_before = table_counts(url, schema, ("delivered",))["delivered"]
    result["history_rows"] = delivered_before
    keys = [f"{design}-{run_id()}-{i}" for i in range(messages)]
    t0 = time.perf_counter()
    seed_backlog(url, schema, target=target, keys=keys)
    result["seed_s"] = time.perf_counter() - t0
    with connect(url, autocommit=True) as conn:  # fresh planner statistics, as in production
        conn.execute(sql.SQL("ANALYZE {}.messages").format(sql.Identifier(schema)))

    before = receiver.counts() if receiver else None
    receiver_clock = CpuClock(receiver.pid) if receiver else None
    rcpu0 = receiver_clock.read() if receiver_clock else None
    pgcpu0 = bench.pg_clock.read() if bench.pg_clock else None
    cpu0, wall0 = time.process_time(), time.perf_counter()
    drain = _drain_ours if design == "outbox" else _drain_naive
    figures = asyncio.run(drain(bench, schema, http))
    seconds = time.perf_counter() - wall0
    own_cpu = time.process_time() - cpu0
    pg_cpu = _delta(bench.pg_clock.read() if bench.pg_clock else None, pgcpu0)
    receiver_cpu = _delta(receiver_clock.read() if receiver_clock else None, rcpu0)
    after = receiver.counts() if receiver else None
    rows = table_counts(url, schema, ("messages", "delivered"))
    new_rows = rows["delivered"] - delivered_before

    delivered: int = figures["delivered"]
    round_trips = figures.get("round_trips")
    result.update(figures)
    result.update(
        {
            "seconds": seconds,
            "msgs_per_s": delivered / seconds if seconds > 0 else None,
            "round_trips_per_msg": round_trips / delivered
            if round_trips is not None and delivered
            else None,
            "cpu_dispatcher_us_per_msg": _per_msg_us(own_cpu, delivered),
            "cpu_postgres_us_per_msg": _per_msg_us(pg_cpu, delivered),
            "cpu_receiver_us_per_msg": _per_msg_us(receiver_cpu, delivered),
            "rows_in_messages": rows["messages"],
            "rows_in_delivered": new_rows,
        }
    )
    failures: list[str] = []
    if figures["timed_out"]:
        failures.append(f"not drained within {bench.settings.drain_timeout:g} s")
    if delivered != messages:
        failures.append(f"delivered {delivered}, expected {messages}")
    if rows["messages"] != 0:
        failures.append(f"{rows['messages']} rows left in messages")
    if new_rows != messages:
        failures.append(f"{new_rows} new rows in delivered, expected {messages}")
    if before is not None and after is not None:
        requests = after["requests"] - before["requests"]
        duplicates = after["duplicates"] - before["duplicates"]
        result["receiver_requests"] = requests
        result["duplicates"] = duplicates
        if requests != messages:
            failures.append(f"receiver saw {requests} requests, expected {messages}")
        if duplicates:
            failures.append(f"receiver saw {duplicates} duplicate keys")
    else:
        result["duplicates"] = None  # no receiver: the transport answered
    result["ok"] = not failures
    result["failures"] = failures
    return result


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs of one design."""
    keys = (
        "msgs_per_s",
        "seconds",
        "round_trips_per_msg",
        "cpu_dispatcher_us_per_msg",
        "cpu_postgres_us_per_msg",
        "cpu_receiver_us_per_msg",
    )
    summary: dict[str, Any] = {k: median([r.get(k) for r in runs]) for k in keys}
    summary["delivered"] = sum(r["delivered"] for r in runs)
    summary["messages"] = sum(r["messages"] for r in runs)
    duplicates = [r["duplicates"] for r in runs if r.get("duplicates") is not None]
    summary["duplicates"] = sum(duplicates) if duplicates else None
    return summary


def drain_scenario(bench: Bench, name: str, *, http: bool) -> dict[str, Any]:
    """drain-http or drain-noop: ``repeat`` runs, or ``pairs`` pairs with the baseline."""
    s = bench.settings
    ours: list[dict[str, Any]] = []
    naive: list[dict[str, Any]] = []
    if s.baseline == "naive":
        for i in range(s.pairs):
            bench.progress(f"{name}: pair {i + 1}/{s.pairs}: outbox dispatcher")
            ours.append(drain_once(bench, design="outbox", http=http, messages=s.messages))
            bench.progress(f"{name}: pair {i + 1}/{s.pairs}: naive baseline")
            naive.append(drain_once(bench, design="naive", http=http, messages=s.messages))
    else:
        for i in range(s.repeat):
            bench.progress(f"{name}: run {i + 1}/{s.repeat}")
            ours.append(drain_once(bench, design="outbox", http=http, messages=s.messages))
    result: dict[str, Any] = {
        "concurrency": s.concurrency,
        "batch_size": s.batch_size,
        **_summary(ours),
        "runs": ours,
    }
    if naive:
        ratios = [
            a["msgs_per_s"] / b["msgs_per_s"] if a["msgs_per_s"] and b["msgs_per_s"] else None
            for a, b in zip(ours, naive, strict=True)
        ]
        result["baseline"] = {
            "name": "naive",
            "workers": s.naive_workers,
            **_summary(naive),
            "runs": naive,
            "ratios": ratios,
            "median_ratio": median(list(ratios)),
        }
    failures = [f"{r['design']} run: {f}" for r in ours + naive for f in r["failures"]]
    result["ok"] = not failures
    result["failures"] = failures
    return result


def drain_http(bench: Bench) -> dict[str, Any]:
    return drain_scenario(bench, "drain-http", http=True)


def drain_noop(bench: Bench) -> dict[str, Any]:
    return drain_scenario(bench, "drain-noop", http=False)


def history(bench: Bench) -> dict[str, Any]:
    """drain-noop in a schema with ``history_rows`` delivered messages against one
    without, alternating (empty, full) ``history_rounds`` times."""
    s = bench.settings
    empty: list[dict[str, Any]] = []
    full: list[dict[str, Any]] = []
    with fresh_schema(bench.db.url) as empty_schema, fresh_schema(bench.db.url) as full_schema:
        bench.progress(f"history: seeding {s.history_rows:,} delivered messages")
        seed_s = seed_history(bench, full_schema, rows=s.history_rows, target=NOOP_URL)
        for i in range(s.history_rounds):
            bench.progress(f"history: round {i + 1}/{s.history_rounds}: empty history")
            empty.append(
                drain_in(
                    bench, empty_schema, design="outbox", http=False, messages=s.history_messages
                )
            )
            bench.progress(f"history: round {i + 1}/{s.history_rounds}: full history")
            full.append(
                drain_in(
                    bench, full_schema, design="outbox", http=False, messages=s.history_messages
                )
            )
    empty_rate = median([r["msgs_per_s"] for r in empty])
    full_rate = median([r["msgs_per_s"] for r in full])
    failures = [
        f"{r['history_rows']:,} in history: {f}" for r in empty + full for f in r["failures"]
    ]
    return {
        "messages": s.history_messages,
        "history_rows": s.history_rows,
        "rounds": s.history_rounds,
        "empty_msgs_per_s": empty_rate,
        "full_msgs_per_s": full_rate,
        "ratio": full_rate / empty_rate if full_rate and empty_rate else None,
        "ratios": [
            b["msgs_per_s"] / a["msgs_per_s"] if a["msgs_per_s"] and b["msgs_per_s"] else None
            for a, b in zip(empty, full, strict=True)
        ],
        "history_seed_s": seed_s,
        "delivered": sum(r["delivered"] for r in empty + full),
        "empty_runs": empty,
        "full_runs": full,
        "ok": not failures,
        "failures": failures,
    }


# -- latency ------------------------------------------------------------------------


def _produce(
    url: str,
    schema: str,
    target: str,
    prefix: str,
    rate: float,
    count: int,
    ready: Event,
    go: Event,
    out: str,
) -> None:
    """The latency scenario's application, in its own process: ``count`` messages at
    ``rate`` per second, each in its own committed transaction; writes the wall
    time (``time.time()``) right after each commit to ``out`` as JSON."""
    box = Outbox(schema=schema, notify=True)
    commits = [0.0] * count
    late = 0.0
    with connect(url) as conn:
        # warm the connection and the statement cache; rolled back, never delivered
        box.enqueue(conn, url=target, idempotency_key=f"{prefix}warmup", json=payload(0))
        conn.rollback()
        ready.set()
        if not go.wait(60):
            raise RuntimeError("the benchmark never said go")
        start = time.monotonic()
        for i in range(count):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                late = max(late, -delay)
            box.enqueue(conn, url=target, idempotency_key=f"{prefix}{i}", json=payload(i))
            conn.commit()
            commits[i] = time.time()
        elapsed = time.monotonic() - start
    Path(out).write_text(json.dumps({"commits": commits, "late_max_s": late, "elapsed": elapsed}))


async def _wait_for(condition: Callable[[], bool], within: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``within`` seconds pass (False)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def latency(bench: Bench) -> dict[str, Any]:
    s = bench.settings
    receiver = bench.receiver
    count = max(1, round(s.rate * s.duration))
    prefix = f"latency-{run_id()}-"
    failures: list[str] = []
    bench.progress(f"latency: {s.rate:g} msgs/s for {s.duration:g} s ({count:,} messages)")
    with fresh_schema(bench.db.url) as schema, tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "commits.json")
        ready, go = SPAWN.Event(), SPAWN.Event()
        producer = SPAWN.Process(
            target=_produce,
            args=(bench.db.url, schema, receiver.url, prefix, s.rate, count, ready, go, out),
            name="outbox-bench-producer",
            daemon=True,
        )
        before = receiver.counts()
        config = DispatcherConfig(
            schema=schema,
            concurrency=s.concurrency,
            batch_size=s.batch_size,
            allow_private_networks=True,
            listen=True,
            http_client=s.http_client or DispatcherConfig.http_client,
        )
        dispatcher = Dispatcher(bench.db.url, config, log=NullLog())
        cpu: dict[str, float | None] = {}

        async def run() -> int:
            task = asyncio.create_task(dispatcher.run())
            try:
                started = await _wait_for(lambda: dispatcher.stats.claims > 0, 30)
                ready_now = await asyncio.to_thread(ready.wait, 60)
                if not (started and ready_now):
                    failures.append("dispatcher or producer did not start")
                    return 0
                await asyncio.sleep(0.5)  # the listener connects alongside the first claim
                cpu["dispatcher"] = time.process_time()
                cpu["postgres"] = bench.pg_clock.read() if bench.pg_clock else None
                go.set()
                await asyncio.to_thread(producer.join, s.duration * 2 + 60)
                if producer.exitcode != 0:  # it exits 0 only once it wrote its commits
                    failures.append(f"producer failed (exit code {producer.exitcode})")
                    return 0
                if not await _wait_for(lambda: dispatcher.stats.delivered >= count, 60):
                    failures.append(
                        f"only {dispatcher.stats.delivered} of {count} delivered 60 s after "
                        "the last commit"
                    )
                cpu["dispatcher"] = time.process_time() - (cpu["dispatcher"] or 0.0)
                cpu["postgres"] = _delta(
                    bench.pg_clock.read() if bench.pg_clock else None, cpu["postgres"]
                )
                return dispatcher.stats.delivered
            finally:
                dispatcher.stop()
                await task

        producer.start()
        try:
            delivered = asyncio.run(run())
        finally:
            if producer.is_alive():
                producer.terminate()
            producer.join(10)
        after = receiver.counts()
        produced = json.loads(Path(out).read_text()) if Path(out).exists() else None
    arrivals = receiver.arrivals(prefix)
    commits: list[float] = produced["commits"] if produced else []
    latencies_ms = [
        (arrivals[f"{prefix}{i}"] - at) * 1000
        for i, at in enumerate(commits)
        if f"{prefix}{i}" in arrivals
    ]
    duplicates = after["duplicates"] - before["duplicates"]
    if produced and len(latencies_ms) != count:
        failures.append(f"receiver saw {len(latencies_ms)} of {count} messages")
    if duplicates:
        failures.append(f"receiver saw {duplicates} duplicate keys")
    return {
        "offered_rate": s.rate,
        "duration_s": s.duration,
        "messages": count,
        "achieved_rate": count / produced["elapsed"] if produced and produced["elapsed"] else None,
        "producer_late_max_ms": produced["late_max_s"] * 1000 if produced else None,
        "delivered": delivered,
        "received": len(latencies_ms),
        "duplicates": duplicates,
        "p50_ms": percentile(latencies_ms, 50),
        "p95_ms": percentile(latencies_ms, 95),
        "p99_ms": percentile(latencies_ms, 99),
        "max_ms": max(latencies_ms) if latencies_ms else None,
        # from the first commit until the last delivery was recorded
        "cpu_dispatcher_us_per_msg": _per_msg_us(cpu.get("dispatcher"), delivered),
        "cpu_postgres_us_per_msg": _per_msg_us(cpu.get("postgres"), delivered),
        "round_trips_per_msg": dispatcher.stats.round_trips / delivered if delivered else None,
        "msgs_per_claim": delivered / dispatcher.stats.claims if dispatcher.stats.claims else None,
        "ok": not failures,
        "failures": failures,
    }


# -- enqueue ------------------------------------------------------------------------


def _enqueue_timing(url: str, *, count: int, batch: int, notify: bool) -> dict[str, Any]:
    """Time ``count`` enqueues inside open transactions committed every ``batch``."""
    with fresh_schema(url) as schema, connect(url) as conn:
        box = Outbox(schema=schema, notify=notify)
        prefix = f"enqueue-{run_id()}-"
        for i in range(min(200, count)):  # connection and statement caches; not kept
            box.enqueue(conn, url=ENQUEUE_URL, idempotency_key=f"{prefix}w{i}", json=payload(i))
        conn.rollback()
        clock = time.perf_counter_ns
        times_ns = [0] * count
        commits_ns: list[int] = []
        started = clock()
        for i in range(count):
            t0 = clock()
            box.enqueue(conn, url=ENQUEUE_URL, idempotency_key=f"{prefix}{i}", json=payload(i))
            times_ns[i] = clock() - t0
            if (i + 1) % batch == 0 or i + 1 == count:
                t0 = clock()
                conn.commit()
                commits_ns.append(clock() - t0)
        wall = (clock() - started) / 1e9
        stored = table_counts(url, schema, ("messages",))["messages"]
    times_ms = [t / 1e6 for t in times_ns]
    return {
        "notify": notify,
        "count": count,
        "median_ms": statistics.median(times_ms),
        "p99_ms": percentile(times_ms, 99),
        "commit_mean_ms": statistics.fmean(commits_ns) / 1e6,
        "enqueues_per_s": count / wall if wall > 0 else None,
        "stored": stored,
    }


def _throughput_at(bench: Bench, schema: str, workers: int) -> dict[str, Any]:
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
                spent = _delta(bench.pg_clock.read() if bench.pg_clock else None, pg0)
                commits[mode] += sum(r.commits for r in results)
                client_cpu[mode] += sum(r.cpu_s for r in results)
                total = pg_cpu[mode]
                pg_cpu[mode] = None if spent is None or total is None else total + spent
    seconds = s.commit_rounds * s.commit_seconds
    rates = {mode: commits[mode] / seconds for mode in MODES}

    def share(mode: str, of: str) -> float | None:
        return rates[mode] / rates[of] if rates[of] else None

    notify_share = share("outbox", "outbox-no-notify")
    return {
        "workers": workers,
        "seconds_per_mode": seconds,
        "plain_tx_per_s": rates["plain"],
        "floor_tx_per_s": rates["floor"],
        "outbox_tx_per_s": rates["outbox"],
        "outbox_no_notify_tx_per_s": rates["outbox-no-notify"],
        "ratio": share("outbox", "plain"),
        "ratio_no_notify": share("outbox-no-notify", "plain"),
        "floor_ratio": share("floor", "plain"),
        # the targets: the outbox row against the least a durable outbox writes,
        # and what NOTIFY itself costs
        "outbox_to_floor": share("outbox", "floor"),
        "outbox_no_notify_to_floor": share("outbox-no-notify", "floor"),
        "notify_cost": None if notify_share is None else 1 - notify_share,
        # CPU per committed transaction: the application's (Python, psycopg) and
        # PostgreSQL's (each phase starts 0.2 s after the clock, idle then)
        "client_cpu_us_per_tx": {m: _per_msg_us(client_cpu[m], commits[m]) for m in MODES},
        "postgres_cpu_us_per_tx": {m: _per_msg_us(pg_cpu[m], commits[m]) for m in MODES},
    }


def _commit_throughput(bench: Bench) -> list[dict[str, Any]]:
    """:func:`_throughput_at` for each count of ``commit_workers``."""
    results = []
    with fresh_schema(bench.db.url) as schema:
        with connect(bench.db.url, autocommit=True) as conn:
            conn.execute(bench_queries(schema)["business_table"])
            conn.execute(bench_queries(schema)["floor_table"])
        for workers in bench.settings.commit_workers:
            bench.progress(
                f"enqueue: commit throughput, {workers} connections, "
                f"{bench.settings.commit_rounds} x {bench.settings.commit_seconds:g} s per mode"
            )
            results.append(_throughput_at(bench, schema, workers))
    return results


def enqueue(bench: Bench) -> dict[str, Any]:
    s = bench.settings
    failures: list[str] = []
    timings = {}
    for notify in (False, True):
        bench.progress(f"enqueue: {s.enqueue_count:,} enqueues, NOTIFY {'on' if notify else 'off'}")
        timing = _enqueue_timing(
            bench.db.url, count=s.enqueue_count, batch=s.enqueue_batch, notify=notify
        )
        if timing["stored"] != s.enqueue_count:
            failures.append(f"{timing['stored']} messages stored, expected {s.enqueue_count}")
        timings["notify" if notify else "no_notify"] = timing
    throughput = _commit_throughput(bench)
    for t in throughput:
        if not all(t[f"{m}_tx_per_s"] for m in ("plain", "floor", "outbox", "outbox_no_notify")):
            failures.append(f"{t['workers']} connections: a mode committed no transaction")
    return {
        "batch": s.enqueue_batch,
        "no_notify": timings["no_notify"],
        "notify": timings["notify"],
        "commit_throughput": throughput,
        "ok": not failures,
        "failures": failures,
    }


# -- commit latency under an offered load -----------------------------------------------


def _listening(url: str, schema: str) -> bool:
    """Whether some session listens on ``schema``'s wake-up channel."""
    channel = sql.Identifier(f"{schema}_ready").as_string(None)
    with connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = %s AND state = 'idle'",
            (f"LISTEN {channel}",),
        ).fetchone()
    return bool(row and row[0])


def _paced_rate(bench: Bench, committers: Committers, rate: float) -> dict[str, Any]:
    """One offered ``rate`` of business transactions with an outbox row (NOTIFY on):
    commit latency percentiles, and the CPU each transaction cost."""
    s = bench.settings
    pg0 = bench.pg_clock.read() if bench.pg_clock else None
    results = committers.run("outbox", s.commit_rate_seconds, rate=rate)
    pg_cpu = _delta(bench.pg_clock.read() if bench.pg_clock else None, pg0)
    service = [ms for r in results for ms in r.service_ms]
    scheduled = [ms for r in results for ms in r.scheduled_ms]
    commits = sum(r.commits for r in results)
    per_connection = max(1, round(s.commit_rate_seconds * rate / committers.count))
    return {
        "offered_tx_per_s": rate,
        "seconds": s.commit_rate_seconds,
        "expected": per_connection * committers.count,
        "committed": commits,
        "p50_ms": percentile(service, 50),
        "p99_ms": percentile(service, 99),
        "max_ms": max(service) if service else None,
        "p50_from_schedule_ms": percentile(scheduled, 50),
        "p99_from_schedule_ms": percentile(scheduled, 99),
        "producer_late_max_ms": max(r.late_max_s for r in results) * 1000,
        "client_cpu_us_per_tx": _per_msg_us(sum(r.cpu_s for r in results), commits),
        # with a dispatcher, PostgreSQL's CPU includes what it spent dispatching
        "postgres_cpu_us_per_tx": _per_msg_us(pg_cpu, commits),
    }


def commit_latency_in(bench: Bench, schema: str, *, dispatcher: bool = False) -> dict[str, Any]:
    """Commit latency of business transactions with an outbox row (NOTIFY on) at each
    of ``commit_rates``, offered by ``commit_producers`` paced connections sharing
    the rate. With ``dispatcher``, a dispatcher (LISTEN on, :class:`NoopClient`: no
    network) consumes the messages meanwhile, as in production; its claims and
    outcome writes then compete with the producers for PostgreSQL."""
    s = bench.settings
    failures: list[str] = []
    with Committers(bench.db.url, schema, s.commit_producers) as committers:

        def offer() -> list[dict[str, Any]]:
            figures = []
            for rate in s.commit_rates:
                bench.progress(
                    f"commit-latency: {rate:g} tx/s for {s.commit_rate_seconds:g} s, "
                    f"dispatcher {'on' if dispatcher else 'off'}"
                )
                figures.append(_paced_rate(bench, committers, rate))
            return figures

        if dispatcher:
            rates, problems = asyncio.run(_offer_consumed(bench, schema, offer))
            failures += problems
        else:
            rates = offer()
    for r in rates:
        if r["committed"] != r["expected"]:
            failures.append(
                f"{r['offered_tx_per_s']:g} tx/s: {r['committed']} of {r['expected']} "
                "transactions committed within the time bound"
            )
    return {"dispatcher": dispatcher, "rates": rates, "failures": failures}


async def _offer_consumed(
    bench: Bench, schema: str, offer: Callable[[], list[dict[str, Any]]]
) -> tuple[list[dict[str, Any]], list[str]]:
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
        deadline = time.monotonic() + 30
        while not await asyncio.to_thread(_listening, bench.db.url, schema):
            if time.monotonic() > deadline:
                raise RuntimeError("the dispatcher did not start listening within 30 s")
            await asyncio.sleep(0.05)
        rates = await asyncio.to_thread(offer)
        committed = sum(r["committed"] for r in rates)
        if not await _wait_for(lambda: dispatcher.stats.delivered >= committed, 60):
            failures.append(
                f"dispatcher delivered {dispatcher.stats.delivered} of {committed} "
                "60 s after the last commit"
            )
        return rates, failures
    finally:
        dispatcher.stop()
        await task


def commit_latency(bench: Bench) -> dict[str, Any]:
    """:func:`commit_latency_in` without a dispatcher, with one, or both (in fresh
    schemas), as ``commit_dispatcher`` says."""
    choice = bench.settings.commit_dispatcher
    runs = []
    for dispatcher in (False, True):
        if choice == ("on" if dispatcher else "off") or choice == "both":
            with fresh_schema(bench.db.url) as schema:
                with connect(bench.db.url, autocommit=True) as conn:
                    conn.execute(bench_queries(schema)["business_table"])
                    conn.execute(bench_queries(schema)["floor_table"])
                runs.append(commit_latency_in(bench, schema, dispatcher=dispatcher))
    failures = [
        f"dispatcher {'on' if r['dispatcher'] else 'off'}: {f}" for r in runs for f in r["failures"]
    ]
    return {
        "producers": bench.settings.commit_producers,
        "runs": runs,
        "ok": not failures,
        "failures": failures,
    }


SCENARIOS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "drain-http": drain_http,
    "drain-noop": drain_noop,
    "latency": latency,
    "enqueue": enqueue,
    "commit-latency": commit_latency,
    "history": history,
}
