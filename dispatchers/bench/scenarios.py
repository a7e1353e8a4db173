"""The scenarios of ``outbox bench``: each bounded in time and count, each in a fresh
schema that is dropped afterwards, all traffic to 127.0.0.1.

- ``drain-http``: a backlog of ``messages`` delivered to the fast receiver (its own
  process): messages per second, CPU microseconds per message of PostgreSQL, the
  dispatcher and the receiver, and database round trips per message.
- ``drain-noop``: the same with an HTTP client that answers 200 without a network
  (:class:`NoopClient`), so only the queue machinery is timed.
- ``latency``: a steady offered load with dispatcher processes running
  (:mod:`dispatchers.bench.latency`).
- ``enqueue``: time of ``enqueue`` inside an open transaction, with and without
  NOTIFY; commit throughput of business transactions with one outbox row each
  against the same transactions without it and with the floor (one payload row in
  a table keyed by a bigint identity), at each count of connections.
- ``commit-latency``: commit latency of business transactions with one outbox row
  each at offered rates, paced over several connections, with and without a
  dispatcher consuming.
- ``history``: drain-noop with a large delivered history against an empty one.
- ``memory``: drain-http at concurrency 256, then 1,024, against a receiver that
  answers a share of the requests with a huge body: the dispatcher's peak RSS.

Every drain runs the dispatcher in a fresh process of its own (see
:class:`DrainProcess`), so each reports the peak RSS of a dispatcher doing it.

With baselines (``naive``: :mod:`dispatchers.bench.naive`; ``pgqueuer``:
:mod:`dispatchers.bench.pgqueuer_baseline`), each drain scenario runs in rounds, ours
then each baseline's, on the same database and receiver; with ``pgqueuer``, the
latency scenario runs pgqueuer after ours at the same offered load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from psycopg import sql

from dispatchers import loop as loops
from dispatchers.bench import Settings, latency, pgqueuer_baseline
from dispatchers.bench.committers import MODES, Committers
from dispatchers.bench.env import (
    SPAWN,
    CpuClock,
    Database,
    bench_queries,
    connect,
    fresh_schema,
    payload,
    percentile,
    postgres_clock,
    receiver_check,
    run_id,
    seed_backlog,
    table_counts,
)
from dispatchers.bench.naive import NaiveStats, run_naive
from dispatchers.bench.receiver import ReceiverProcess, Replies
from dispatchers.config import DispatcherConfig
from dispatchers.dispatcher import Dispatcher
from dispatchers.log import NullLog
from outbox import Outbox

NOOP_URL = "http://127.0.0.1:9/noop"  # never connected to: the transport answers
ENQUEUE_URL = "http://127.0.0.1:9/orders"  # never sent: nothing dispatches there
MB = 1_000_000
MEMORY_CONCURRENCY = (256, 1024)
"""The memory scenario's drains: the first has the peak RSS target."""
DRAIN_START_TIMEOUT = 120.0  # seconds for a drain process to import and report ready


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


async def _wait_for(condition: Callable[[], bool], within: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``within`` seconds pass (False)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _most(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


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


async def _drain_ours(url: str, s: Settings, schema: str, http: bool) -> dict[str, Any]:
    config = DispatcherConfig(
        schema=schema,
        concurrency=s.concurrency,
        batch_size=s.batch_size,
        allow_private_networks=True,
        http_client=s.http_client or DispatcherConfig.http_client,
    )
    client = None if http else NoopClient()
    dispatcher = Dispatcher(url, config, client=client, log=NullLog())
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


async def _drain_naive(url: str, s: Settings, schema: str, http: bool) -> dict[str, Any]:
    stats = NaiveStats()
    timed_out = False
    try:
        async with asyncio.timeout(s.drain_timeout):
            await run_naive(url, schema, workers=s.naive_workers, http=http, stats=stats)
    except TimeoutError:
        timed_out = True
    return {
        "delivered": stats.delivered,
        "retried": stats.retried,
        "round_trips": stats.round_trips,
        "claims": stats.claims,
        "timed_out": timed_out,
    }


def rss_now() -> int | None:
    """This process's resident set size in bytes, or None where ``/proc`` is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def peak_rss() -> int:
    """This process's peak resident set size in bytes (``ru_maxrss`` is in KiB on
    Linux, in bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _drain_process(
    url: str, settings: Settings, schema: str, design: str, http: bool, pipe: Connection
) -> None:
    """The child's side of :class:`DrainProcess`: report the resident size once
    everything is imported, wait for ``go``, drain, and send back the figures with
    the drain's wall and CPU seconds and the process's peak RSS."""
    drain = _drain_ours if design == "outbox" else _drain_naive
    gc.collect()
    pipe.send(rss_now())
    if not pipe.poll(DRAIN_START_TIMEOUT) or pipe.recv() != "go":
        return
    cpu0, wall0 = time.process_time(), time.perf_counter()
    figures = loops.run(drain(url, settings, schema, http), event_loop=settings.event_loop)
    figures["seconds"] = time.perf_counter() - wall0
    figures["cpu_s"] = time.process_time() - cpu0
    figures["peak_rss"] = peak_rss()
    pipe.send(figures)


class DrainProcess:
    """One drain by ``design`` in a fresh process; a context manager.

    Why a process per drain: peak RSS only grows, so in the bench's own process
    it would report the largest drain so far (or the seeding of a million rows),
    and freed memory kept by the allocator would blur what one drain needs.
    Sampling the RSS during the drain would miss a short burst between samples.
    A fresh process doing only the drain is what ``outbox dispatch`` is: its
    ``ru_maxrss`` is exact, whatever the burst. Its size once everything is
    imported (before the drain) is reported too, so the growth the drain caused
    can be told from the interpreter and its libraries.

    Entering starts the process and waits until it is ready; :meth:`run` starts
    the drain and returns its figures (the caller reads its own clocks around it);
    leaving always ends the process.
    """

    def __init__(
        self, url: str, settings: Settings, schema: str, *, design: str, http: bool
    ) -> None:
        self.settings = settings
        self._pipe, theirs = SPAWN.Pipe()
        self._process = SPAWN.Process(
            target=_drain_process,
            args=(url, settings, schema, design, http, theirs),
            name=f"outbox-bench-drain-{design}",
            daemon=True,
        )
        self._theirs = theirs
        self.rss_ready: int | None = None

    def __enter__(self) -> DrainProcess:
        self._process.start()
        self._theirs.close()  # so that the child's exit reads as end of file here
        try:
            self.rss_ready = self._receive(DRAIN_START_TIMEOUT, "start")
        except BaseException:
            self._end()
            raise
        return self

    def run(self) -> dict[str, Any]:
        self._pipe.send("go")
        figures: dict[str, Any] = self._receive(self.settings.drain_timeout + 60, "drain")
        return figures

    def _receive(self, timeout: float, what: str) -> Any:
        try:
            if self._pipe.poll(timeout):
                return self._pipe.recv()
        except EOFError:
            pass
        self._process.join(5)
        raise RuntimeError(f"the drain process did not {what} (exit code {self._process.exitcode})")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end()

    def _end(self) -> None:
        self._process.join(10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(10)
        self._pipe.close()


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


def drain_once(
    bench: Bench,
    *,
    design: str,
    http: bool,
    messages: int,
    receiver: ReceiverProcess | None = None,
    concurrency: int | None = None,
) -> dict[str, Any]:
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
) -> dict[str, Any]:
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
    with DrainProcess(url, settings, schema, design=design, http=http) as child:
        rcpu0 = receiver_clock.read() if receiver_clock else None
        pgcpu0 = bench.pg_clock.read() if bench.pg_clock else None
        figures = child.run()
        pg_cpu = _delta(bench.pg_clock.read() if bench.pg_clock else None, pgcpu0)
        receiver_cpu = _delta(receiver_clock.read() if receiver_clock else None, rcpu0)
    seconds = figures.pop("seconds")
    own_cpu = figures.pop("cpu_s")
    peak = figures.pop("peak_rss")
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
            "concurrency": settings.concurrency if design == "outbox" else None,
            "peak_rss_mb": peak / MB,
            "rss_growth_mb": None if child.rss_ready is None else (peak - child.rss_ready) / MB,
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
        seen, problems = receiver_check(before, after, messages)
        result.update(seen)
        result["big_responses"] = after["big_responses"] - before["big_responses"]
        failures += problems
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
    # memory: the worst run, not a typical one
    summary["peak_rss_mb"] = _most([r.get("peak_rss_mb") for r in runs])
    summary["rss_growth_mb"] = _most([r.get("rss_growth_mb") for r in runs])
    summary["delivered"] = sum(r["delivered"] for r in runs)
    summary["messages"] = sum(r["messages"] for r in runs)
    duplicates = [r["duplicates"] for r in runs if r.get("duplicates") is not None]
    summary["duplicates"] = sum(duplicates) if duplicates else None
    return summary


def _baseline_drain(bench: Bench, baseline: str, *, http: bool) -> dict[str, Any]:
    """One timed drain of ``messages`` by the ``baseline`` design."""
    s = bench.settings
    if baseline == "pgqueuer":
        return pgqueuer_baseline.drain(
            bench.db.url,
            messages=s.messages,
            receiver=bench.receiver if http else None,
            pg_clock=bench.pg_clock,
            concurrency=s.concurrency,
            timeout=s.drain_timeout,
        )
    return drain_once(bench, design="naive", http=http, messages=s.messages)


def _baseline_facts(settings: Settings, baseline: str) -> dict[str, Any]:
    """How the ``baseline`` design was configured, for the report."""
    if baseline == "pgqueuer":
        return {
            "name": "pgqueuer",
            "version": pgqueuer_baseline.version(),
            "managers": pgqueuer_baseline.DRAIN_MANAGERS,
            "batch_size": pgqueuer_baseline.BATCH_SIZE,
        }
    return {"name": "naive", "workers": settings.naive_workers}


def require_baselines(settings: Settings) -> None:
    """Refuse to start when a baseline's packages are missing (say which)."""
    if "pgqueuer" in settings.baselines and (reason := pgqueuer_baseline.available()):
        raise RuntimeError(f"--baseline pgqueuer: {reason}")


def drain_scenario(bench: Bench, name: str, *, http: bool) -> dict[str, Any]:
    """drain-http or drain-noop: ``repeat`` runs, or ``pairs`` rounds of ours and
    each baseline's, interleaved."""
    s = bench.settings
    ours: list[dict[str, Any]] = []
    theirs: dict[str, list[dict[str, Any]]] = {b: [] for b in s.baselines}
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
    result: dict[str, Any] = {
        "concurrency": s.concurrency,
        "batch_size": s.batch_size,
        **_summary(ours),
        "runs": ours,
        "baselines": [],
    }
    for baseline, runs in theirs.items():
        ratios = [
            a["msgs_per_s"] / b["msgs_per_s"] if a["msgs_per_s"] and b["msgs_per_s"] else None
            for a, b in zip(ours, runs, strict=True)
        ]
        result["baselines"].append(
            {
                **_baseline_facts(s, baseline),
                **_summary(runs),
                "runs": runs,
                "ratios": ratios,
                "median_ratio": median(list(ratios)),
            }
        )
    every = ours + [r for runs in theirs.values() for r in runs]
    failures = [f"{r['design']} run: {f}" for r in every for f in r["failures"]]
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
        "empty_peak_rss_mb": _most([r["peak_rss_mb"] for r in empty]),
        "full_peak_rss_mb": _most([r["peak_rss_mb"] for r in full]),
        "delivered": sum(r["delivered"] for r in empty + full),
        "empty_runs": empty,
        "full_runs": full,
        "ok": not failures,
        "failures": failures,
    }


def memory(bench: Bench) -> dict[str, Any]:
    """drain-http of ``memory_messages`` at each of :data:`MEMORY_CONCURRENCY`,
    against a receiver of its own that answers every request ``memory_delay``
    seconds late (so requests pile up to the concurrency, each on its own
    connection) and ``big_response_share`` of them with a body of
    ``big_response_mb``: every message delivered once, and the peak RSS of the
    dispatcher doing it."""
    s = bench.settings
    replies = Replies(s.memory_delay, s.big_response_share, round(s.big_response_mb * MB))
    runs: list[dict[str, Any]] = []
    for concurrency in MEMORY_CONCURRENCY:
        bench.progress(
            f"memory: {s.memory_messages:,} messages at concurrency {concurrency:,}, "
            f"{s.big_response_share:g} of the responses {s.big_response_mb:g} MB long"
        )
        # a receiver per drain: its connection counts are this drain's
        with ReceiverProcess(replies=replies) as receiver:
            run = drain_once(
                bench,
                design="outbox",
                http=True,
                messages=s.memory_messages,
                receiver=receiver,
                concurrency=concurrency,
            )
            counts = receiver.counts()
        run["receiver_connections"] = counts["connections"]
        run["most_open_connections"] = counts["most_open_connections"]
        run["big_mb_sent"] = counts["big_bytes_sent"] / MB
        runs.append(run)
    failures = [f"concurrency {r['concurrency']}: {f}" for r in runs for f in r["failures"]]
    return {
        "messages": s.memory_messages,
        "big_response_share": s.big_response_share,
        "big_response_mb": s.big_response_mb,
        "delay_s": s.memory_delay,
        "runs": runs,
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
            rates, problems = loops.run(
                _offer_consumed(bench, schema, offer), event_loop=bench.settings.event_loop
            )
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
        waker = dispatcher.waker
        if not await _wait_for(
            lambda: bool(waker and waker.on_duty and dispatcher.stats.claims), 30
        ):
            raise RuntimeError("the dispatcher did not go on duty within 30 s")
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
    "latency": latency.latency,
    "enqueue": enqueue,
    "commit-latency": commit_latency,
    "history": history,
    "memory": memory,
}
