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
  against the same transactions without it.
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
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from psycopg import sql

from dispatchers import loop as loops
from dispatchers.bench import Settings
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
    s = bench.settings
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
    figures = loops.run(drain(bench, schema, http), event_loop=s.event_loop)
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
            delivered = loops.run(run(), event_loop=s.event_loop)
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


def _commit_worker(url: str, schema: str, number: int, pipe: Connection) -> None:
    """One business connection of the commit-throughput comparison, in its own process.

    Receives ``(mode, start_at, seconds)``; from ``start_at`` (wall time) commits
    transactions for ``seconds`` and sends back how many, and the CPU seconds it
    used; ``None`` ends it. Modes:
    ``plain`` (the business INSERT alone), ``outbox`` (plus one enqueue, NOTIFY
    on) and ``outbox-no-notify``.
    """
    boxes = {
        "outbox": Outbox(schema=schema, notify=True),
        "outbox-no-notify": Outbox(schema=schema, notify=False),
    }
    insert = bench_queries(schema)["business_insert"]
    prefix = f"commit-{run_id()}-{number}-"
    sequence = 0
    with connect(url) as conn:
        pipe.send("ready")
        while True:
            command = pipe.recv()
            if command is None:
                return
            mode, start_at, seconds = command
            box = boxes.get(mode)
            time.sleep(max(0.0, start_at - time.time()))
            end = start_at + seconds
            commits = 0
            cpu = time.process_time()
            while time.time() < end:
                sequence += 1
                conn.execute(insert, {"customer_id": sequence % 1000, "amount_cents": 1299})
                if box is not None:
                    box.enqueue(
                        conn,
                        url=ENQUEUE_URL,
                        idempotency_key=f"{prefix}{sequence}",
                        json=payload(sequence),
                    )
                conn.commit()
                commits += 1
            pipe.send((commits, time.process_time() - cpu))


def _commit_throughput(bench: Bench) -> dict[str, Any]:
    s = bench.settings
    modes = ("plain", "outbox", "outbox-no-notify")
    commits = dict.fromkeys(modes, 0)
    client_cpu = dict.fromkeys(modes, 0.0)
    pg_cpu: dict[str, float | None] = dict.fromkeys(modes, 0.0)
    with fresh_schema(bench.db.url) as schema:
        with connect(bench.db.url, autocommit=True) as conn:
            conn.execute(bench_queries(schema)["business_table"])
        pipes: list[Connection] = []
        workers = []
        try:
            for number in range(s.commit_workers):
                ours, theirs = SPAWN.Pipe()
                worker = SPAWN.Process(
                    target=_commit_worker,
                    args=(bench.db.url, schema, number, theirs),
                    name=f"outbox-bench-committer-{number}",
                    daemon=True,
                )
                worker.start()
                theirs.close()
                pipes.append(ours)
                workers.append(worker)
            for pipe in pipes:
                if not pipe.poll(60) or pipe.recv() != "ready":
                    raise RuntimeError("a commit worker did not start")
            for _ in range(s.commit_rounds):
                for mode in modes:
                    start_at = time.time() + 0.2
                    for pipe in pipes:
                        pipe.send((mode, start_at, s.commit_seconds))
                    pg0 = bench.pg_clock.read() if bench.pg_clock else None
                    for pipe in pipes:
                        if not pipe.poll(s.commit_seconds + 60):
                            raise RuntimeError("a commit worker stopped answering")
                        count, cpu = pipe.recv()
                        commits[mode] += int(count)
                        client_cpu[mode] += float(cpu)
                    spent = _delta(bench.pg_clock.read() if bench.pg_clock else None, pg0)
                    total = pg_cpu[mode]
                    pg_cpu[mode] = None if spent is None or total is None else total + spent
            for pipe in pipes:
                pipe.send(None)
        finally:
            for worker in workers:
                worker.join(10)
                if worker.is_alive():
                    worker.terminate()
                    worker.join(5)
            for pipe in pipes:
                pipe.close()
    seconds = s.commit_rounds * s.commit_seconds
    rates = {mode: commits[mode] / seconds for mode in modes}
    return {
        "workers": s.commit_workers,
        "seconds_per_mode": seconds,
        "plain_tx_per_s": rates["plain"],
        "outbox_tx_per_s": rates["outbox"],
        "outbox_no_notify_tx_per_s": rates["outbox-no-notify"],
        "ratio": rates["outbox"] / rates["plain"] if rates["plain"] else None,
        "ratio_no_notify": rates["outbox-no-notify"] / rates["plain"] if rates["plain"] else None,
        # CPU per committed transaction: the application's (Python, psycopg) and
        # PostgreSQL's (the phase starts 0.2 s after the clock, idle then)
        "client_cpu_us_per_tx": {m: _per_msg_us(client_cpu[m], commits[m]) for m in modes},
        "postgres_cpu_us_per_tx": {m: _per_msg_us(pg_cpu[m], commits[m]) for m in modes},
    }


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
    bench.progress(
        f"enqueue: commit throughput, {s.commit_workers} connections, "
        f"{s.commit_rounds} x {s.commit_seconds:g} s per mode"
    )
    throughput = _commit_throughput(bench)
    if not all(throughput[k] for k in ("plain_tx_per_s", "outbox_tx_per_s")):
        failures.append("no transaction committed")
    return {
        "batch": s.enqueue_batch,
        "no_notify": timings["no_notify"],
        "notify": timings["notify"],
        "commit_throughput": throughput,
        "ok": not failures,
        "failures": failures,
    }


SCENARIOS: dict[str, Callable[[Bench], dict[str, Any]]] = {
    "drain-http": drain_http,
    "drain-noop": drain_noop,
    "latency": latency,
    "enqueue": enqueue,
    "history": history,
}
