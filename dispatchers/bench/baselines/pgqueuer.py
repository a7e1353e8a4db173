"""THE PGQUEUER BASELINE: pgqueuer, a PostgreSQL job queue, beside the dispatcher.

``outbox bench --baseline pgqueuer`` runs pgqueuer on the same database and
receiver, with the settings its own documentation gives for throughput, installed
into a fresh schema that is dropped afterwards.

The module stays whole past the usual length: it is the one place that imports
pgqueuer and asyncpg (an import-linter contract holds every other module to
that), and its drain and latency runs share the installation and the consumer.

Design: docs/explanation/design/bench-baselines.md
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from importlib import metadata
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg.rows import class_row

from dispatchers.bench.env import (
    SPAWN,
    CpuClock,
    bench_queries,
    connect,
    payload,
    receiver_check,
    run_id,
)
from dispatchers.bench.measure import delta, per_msg_us, percentile
from dispatchers.bench.receiver_process import ReceiverProcess
from dispatchers.bench.results import DrainRun, PgqueuerLatency
from outbox.internal import check_schema_name

if TYPE_CHECKING:
    import aiohttp
    import asyncpg
    from pgqueuer.domain.settings import DBSettings
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

__all__ = [
    "BATCH_SIZE",
    "DRAIN_MANAGERS",
    "available",
    "drain",
    "latency",
    "version",
]

DRAIN_MANAGERS = 5  # tools/benchmark.py --dequeue
LATENCY_MANAGERS = 1  # one `pgq run` process
BATCH_SIZE = 10  # tools/benchmark.py --dequeue-batch-size, QueueManager.run's default
ENTRYPOINT = "deliver"
SEED_CHUNK = 5000  # jobs per enqueue statement while seeding a backlog
REQUEST_TIMEOUT = 10.0
LISTEN_PROBES = 30  # one-second NOTIFY round trips tried before the consumer is "not listening"
T = TypeVar("T")


def available() -> str | None:
    """None when pgqueuer, asyncpg and uvloop can be imported; else why not."""
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
        import uvloop  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install 'pg-outbox[bench]')"
    return None


def version() -> str | None:
    try:
        return metadata.version("pgqueuer")
    except metadata.PackageNotFoundError:
        return None


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh uvloop event loop, as ``pgq run`` does."""
    import uvloop

    return uvloop.run(coro)


# -- installation ---------------------------------------------------------------------


def _settings(schema: str) -> DBSettings:
    """pgqueuer's object names, all in ``schema``, with a NOTIFY channel of its own."""
    from pgqueuer.domain.settings import DBSettings, Durability
    from pgqueuer.types import Channel

    return DBSettings(
        prefix="", db_schema=schema, channel=Channel(schema), durability=Durability.durable
    )


@dataclass
class Counters:
    """What one pgqueuer run did, as its entrypoint and its drivers saw it."""

    round_trips: int = 0
    handled: int = 0
    duplicates: int = 0
    failed: int = 0
    seen: set[int] = field(default_factory=set, repr=False)
    expected: int | None = None
    """When set, :attr:`all_handled` is set once this many jobs were handled."""
    all_handled: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def record(self, job_id: int) -> None:
        if job_id in self.seen:
            self.duplicates += 1
        else:
            self.seen.add(job_id)
        self.handled += 1
        if self.expected is not None and self.handled >= self.expected:
            self.all_handled.set()


def _queries(connection: asyncpg.Connection, settings: DBSettings, counters: Counters) -> Queries:
    """pgqueuer's ``Queries`` on one asyncpg connection, counting the statements sent."""
    from pgqueuer.adapters.persistence import qb
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    class CountingDriver(AsyncpgDriver):
        async def fetch(self, query: str, *args: object) -> list[dict[str, object]]:
            counters.round_trips += 1
            return await super().fetch(query, *args)

        async def execute(self, query: str, *args: object) -> str:
            counters.round_trips += 1
            return await super().execute(query, *args)

    return Queries(
        CountingDriver(connection),
        qbe=qb.QueryBuilderEnvironment(settings),
        qbq=qb.QueryQueueBuilder(settings),
        qbs=qb.QuerySchedulerBuilder(settings),
    )


async def _install(url: str, schema: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        queries = _queries(connection, _settings(schema), Counters())
        await queries.install()
        await queries.optimize_autovacuum()  # `pgq autovac`
    finally:
        await connection.close()


@contextmanager
def installed(url: str) -> Iterator[str]:
    """pgqueuer installed in a fresh schema (its name yielded), dropped afterwards."""
    schema = check_schema_name(f"outbox_bench_pgq_{uuid.uuid4().hex[:12]}")
    try:
        _run(_install(url, schema))
        yield schema
    finally:
        with connect(url, autocommit=True) as conn:
            conn.execute(bench_queries(schema)["drop_schema"])


@dataclass(frozen=True)
class _QueueCounts:
    """Jobs left in pgqueuer's queue table, and jobs it logged as successful."""

    queued: int
    logged: int


def _counts(url: str, schema: str) -> _QueueCounts:
    with connect(url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=class_row(_QueueCounts))
        counts = cur.execute(bench_queries(schema)["pgqueuer_counts"]).fetchone()
    if counts is None:
        raise RuntimeError("pgqueuer's counts returned no row")
    return counts


# -- the consumer --------------------------------------------------------------------


def _session(limit: int) -> aiohttp.ClientSession:
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit),
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        trust_env=False,
    )


def _handler(
    counters: Counters, session: aiohttp.ClientSession | None, target: str | None
) -> Callable[[Job], Coroutine[Any, Any, None]]:
    """The entrypoint: POST the job's payload with its key to ``target``, or (no
    session) nothing at all, as drain-noop's client answers without a network."""

    async def deliver(job: Job) -> None:
        counters.record(int(job.id))
        if session is None or target is None:
            return
        key = str((job.headers or {}).get("key", ""))
        async with session.post(
            target,
            data=job.payload or b"",
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
        ) as response:
            await response.read()
            if not 200 <= response.status < 300:
                counters.failed += 1
                response.raise_for_status()

    return deliver


@dataclass
class _Consumer:
    """``managers`` QueueManagers on one asyncpg connection each, one entrypoint."""

    url: str
    schema: str
    managers: int
    target: str | None
    concurrency: int
    counters: Counters = field(default_factory=Counters)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, *, drain: bool, started: asyncio.Event | None = None) -> None:
        """Drain the queue and return (``drain``), or handle jobs until :attr:`stop`
        is set, setting ``started`` once the first manager hears its NOTIFYs."""
        import asyncpg
        from pgqueuer.qm import QueueManager
        from pgqueuer.types import Channel, QueueExecutionMode

        settings = _settings(self.schema)
        connections: list[asyncpg.Connection] = []
        session = _session(self.concurrency) if self.target else None
        try:
            for _ in range(self.managers):
                connections.append(await asyncpg.connect(self.url))
            qms = [
                QueueManager(
                    _queries(c, settings, self.counters), channel=Channel(settings.channel)
                )
                for c in connections
            ]
            deliver = _handler(self.counters, session, self.target)
            for qm in qms:
                qm.entrypoint(ENTRYPOINT, accepts_context=False)(deliver)
            mode = QueueExecutionMode.drain if drain else QueueExecutionMode.continuous
            runs = [asyncio.create_task(qm.run(batch_size=BATCH_SIZE, mode=mode)) for qm in qms]
            try:
                if started is not None:
                    await self._until_listening(qms[0], runs)
                    started.set()
                if not drain:
                    stopping = asyncio.create_task(self.stop.wait())
                    await asyncio.wait([stopping, *runs], return_when=asyncio.FIRST_COMPLETED)
                    stopping.cancel()
                    for qm in qms:
                        qm.shutdown.set()
                await asyncio.gather(*runs)
            finally:
                for qm in qms:
                    qm.shutdown.set()
                for task in runs:
                    task.cancel()
                await asyncio.gather(*runs, return_exceptions=True)
        finally:
            if session is not None:
                await session.close()
            for connection in connections:
                await connection.close()

    @staticmethod
    async def _until_listening(qm: QueueManager, runs: list[asyncio.Task[None]]) -> None:
        """Wait until a NOTIFY reaches ``qm``'s listener (pgqueuer's own probe)."""
        from pgqueuer.domain.errors import FailingListenerError

        for _ in range(LISTEN_PROBES):
            if any(task.done() for task in runs):
                await asyncio.gather(*runs)  # raises what ended it
                raise RuntimeError("pgqueuer's QueueManager ended before it listened")
            try:
                await qm.listener_healthy(timeout=timedelta(seconds=1))
                return
            except FailingListenerError:
                continue
        raise RuntimeError(f"pgqueuer's listener answered no probe in {LISTEN_PROBES} s")


# -- drain ------------------------------------------------------------------------------


async def _seed(url: str, schema: str, keys: list[str]) -> None:
    """Enqueue one job per key with pgqueuer's own batch enqueue (as its benchmark
    seeds its drain), then ANALYZE the queue table."""
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        queries = _queries(connection, _settings(schema), Counters())
        for start in range(0, len(keys), SEED_CHUNK):
            chunk = keys[start : start + SEED_CHUNK]
            await queries.enqueue(
                [ENTRYPOINT] * len(chunk),
                [json.dumps(payload(start + i)).encode() for i in range(len(chunk))],
                [0] * len(chunk),
                headers=[{"key": key} for key in chunk],
            )
    finally:
        await connection.close()
    with connect(url, autocommit=True) as conn:  # fresh planner statistics, as ours get
        conn.execute(bench_queries(schema)["pgqueuer_analyze"])


def drain(
    url: str,
    *,
    messages: int,
    receiver: ReceiverProcess | None,
    pg_clock: CpuClock | None,
    concurrency: int,
    timeout: float,
) -> DrainRun:
    """Seed ``messages`` jobs and time pgqueuer draining them (POSTed to ``receiver``,
    or handled without a network when it is None), checking each was handled once."""
    with installed(url) as schema:
        keys = [f"pgqueuer-{run_id()}-{i}" for i in range(messages)]
        t0 = time.perf_counter()
        _run(_seed(url, schema, keys))
        seed_s = time.perf_counter() - t0
        consumer = _Consumer(
            url,
            schema,
            DRAIN_MANAGERS,
            receiver.url if receiver else None,
            concurrency,
        )

        async def timed() -> bool:
            try:
                async with asyncio.timeout(timeout):
                    await consumer.run(drain=True)
            except TimeoutError:
                return True
            return False

        before = receiver.counts() if receiver else None
        receiver_clock = CpuClock(receiver.pid) if receiver else None
        rcpu0 = receiver_clock.read() if receiver_clock else None
        pgcpu0 = pg_clock.read() if pg_clock else None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        timed_out = _run(timed())
        seconds = time.perf_counter() - wall0
        own_cpu = time.process_time() - cpu0
        pg_cpu = delta(pg_clock.read() if pg_clock else None, pgcpu0)
        receiver_cpu = delta(receiver_clock.read() if receiver_clock else None, rcpu0)
        after = receiver.counts() if receiver else None
        rows = _counts(url, schema)

    c = consumer.counters
    delivered = len(c.seen)
    failures: list[str] = []
    if timed_out:
        failures.append(f"not drained within {timeout:g} s")
    if delivered != messages:
        failures.append(f"handled {delivered} distinct jobs, expected {messages}")
    if c.duplicates:
        failures.append(f"{c.duplicates} jobs handled more than once")
    if c.failed:
        failures.append(f"{c.failed} requests failed")
    if rows.queued != 0:
        failures.append(f"{rows.queued} jobs left in the queue table")
    if rows.logged != messages:
        failures.append(f"{rows.logged} jobs logged successful, expected {messages}")
    receiver_requests = None
    duplicates = c.duplicates
    if before is not None and after is not None:
        seen, problems = receiver_check(before, after, messages)
        receiver_requests, duplicates = seen.requests, seen.duplicates
        failures += problems
    return DrainRun(
        design="pgqueuer",
        messages=messages,
        seed_s=seed_s,
        delivered=delivered,
        handled=c.handled,
        round_trips=c.round_trips,
        timed_out=timed_out,
        seconds=seconds,
        msgs_per_s=delivered / seconds if seconds > 0 else None,
        round_trips_per_msg=c.round_trips / delivered if delivered else None,
        cpu_dispatcher_us_per_msg=per_msg_us(own_cpu, delivered),
        cpu_postgres_us_per_msg=per_msg_us(pg_cpu, delivered),
        cpu_receiver_us_per_msg=per_msg_us(receiver_cpu, delivered),
        rows_in_queue=rows.queued,
        rows_logged_successful=rows.logged,
        receiver_requests=receiver_requests,
        duplicates=duplicates,
        ok=not failures,
        failures=failures,
    )


# -- latency ------------------------------------------------------------------------


def _produce(
    url: str,
    schema: str,
    prefix: str,
    rate: float,
    count: int,
    ready: Event,
    go: Event,
    out: str,
) -> None:
    """The application, in its own process: ``count`` jobs at ``rate`` per second with
    ``Queries.enqueue``, each its own committed transaction (asyncpg autocommits;
    pgqueuer's trigger sends the NOTIFY); writes the wall time (``time.time()``)
    right after each commit to ``out`` as JSON."""
    produced = asyncio.run(_produce_async(url, schema, prefix, rate, count, ready, go))
    Path(out).write_text(json.dumps(produced))


async def _produce_async(
    url: str, schema: str, prefix: str, rate: float, count: int, ready: Event, go: Event
) -> dict[str, Any]:
    import asyncpg

    commits = [0.0] * count
    late = 0.0
    connection = await asyncpg.connect(url)
    try:
        queries = _queries(connection, _settings(schema), Counters())
        # warm the connection and its statement cache; rolled back, never handled
        transaction = connection.transaction()
        await transaction.start()
        await queries.enqueue(ENTRYPOINT, b"{}", headers={"key": f"{prefix}warmup"})
        await transaction.rollback()
        ready.set()
        if not await asyncio.to_thread(go.wait, 60):
            raise RuntimeError("the benchmark never said go")
        start = time.monotonic()
        for i in range(count):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late = max(late, -delay)
            await queries.enqueue(
                ENTRYPOINT,
                json.dumps(payload(i)).encode(),
                headers={"key": f"{prefix}{i}"},
            )
            commits[i] = time.time()
        elapsed = time.monotonic() - start
    finally:
        await connection.close()
    return {"commits": commits, "late_max_s": late, "elapsed": elapsed}


def latency(
    url: str,
    *,
    receiver: ReceiverProcess,
    pg_clock: CpuClock | None,
    rate: float,
    duration: float,
    concurrency: int,
) -> PgqueuerLatency:
    """A steady ``rate`` of jobs for ``duration`` seconds, enqueued by another
    process and POSTed to ``receiver`` by a pgqueuer consumer in this one: commit to
    receiver percentiles and CPU per message of the consumer and PostgreSQL."""
    count = max(1, round(rate * duration))
    prefix = f"pgqueuer-latency-{run_id()}-"
    failures: list[str] = []
    cpu: dict[str, float | None] = {}
    with installed(url) as schema, tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "commits.json")
        ready, go = SPAWN.Event(), SPAWN.Event()
        producer = SPAWN.Process(
            target=_produce,
            args=(url, schema, prefix, rate, count, ready, go, out),
            name="outbox-bench-pgqueuer-producer",
            daemon=True,
        )
        consumer = _Consumer(url, schema, LATENCY_MANAGERS, receiver.url, concurrency)
        consumer.counters.expected = count
        before = receiver.counts()

        async def run() -> None:
            listening = asyncio.Event()
            task = asyncio.create_task(consumer.run(drain=False, started=listening))
            try:
                waiter = asyncio.create_task(listening.wait())
                await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if task.done():
                    await task  # raises what ended it
                if not await asyncio.to_thread(ready.wait, 60):
                    failures.append("producer did not start")
                    return
                cpu["consumer"] = time.process_time()
                cpu["postgres"] = pg_clock.read() if pg_clock else None
                go.set()
                await asyncio.to_thread(producer.join, duration * 2 + 60)
                if producer.exitcode != 0:  # it exits 0 only once it wrote its commits
                    failures.append(f"producer failed (exit code {producer.exitcode})")
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(consumer.counters.all_handled.wait(), 60)
                if consumer.counters.handled < count:
                    failures.append(
                        f"only {consumer.counters.handled} of {count} handled 60 s after "
                        "the last commit"
                    )
                cpu["consumer"] = time.process_time() - (cpu["consumer"] or 0.0)
                cpu["postgres"] = delta(pg_clock.read() if pg_clock else None, cpu["postgres"])
            finally:
                consumer.stop.set()
                await task

        producer.start()
        try:
            _run(run())
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
    delivered = len(consumer.counters.seen)
    duplicates = after["duplicates"] - before["duplicates"]
    if produced and len(latencies_ms) != count:
        failures.append(f"receiver saw {len(latencies_ms)} of {count} jobs")
    if duplicates or consumer.counters.duplicates:
        failures.append(
            f"receiver saw {duplicates} duplicate keys; "
            f"{consumer.counters.duplicates} jobs handled twice"
        )
    if consumer.counters.failed:
        failures.append(f"{consumer.counters.failed} requests failed")
    return PgqueuerLatency(
        name="pgqueuer",
        version=version(),
        managers=LATENCY_MANAGERS,
        batch_size=BATCH_SIZE,
        offered_rate=rate,
        duration_s=duration,
        messages=count,
        achieved_rate=count / produced["elapsed"] if produced and produced["elapsed"] else None,
        producer_late_max_ms=produced["late_max_s"] * 1000 if produced else None,
        delivered=delivered,
        received=len(latencies_ms),
        duplicates=duplicates,
        p50_ms=percentile(latencies_ms, 50),
        p95_ms=percentile(latencies_ms, 95),
        p99_ms=percentile(latencies_ms, 99),
        max_ms=max(latencies_ms) if latencies_ms else None,
        cpu_dispatcher_us_per_msg=per_msg_us(cpu.get("consumer"), delivered),
        cpu_postgres_us_per_msg=per_msg_us(cpu.get("postgres"), delivered),
        round_trips_per_msg=consumer.counters.round_trips / delivered if delivered else None,
        ok=not failures,
        failures=failures,
    )
