"""The ``latency`` scenario: commit-to-receiver latency and the cost per message at
a steady offered load.

Producer processes commit at each offered rate while ``outbox dispatch``
processes deliver to the bench receiver; every process measures between the same
two marks (just before the producers start, and once every message is recorded
as delivered).

The module stays whole: it is one scenario, whose producers, dispatchers and
measures are read between the same two marks.

Design: docs/explanation/design/benchmarks.md
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess as SpawnProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from dispatchers.bench import LATENCY_SECONDS
from dispatchers.bench.baselines import pgqueuer
from dispatchers.bench.context import Bench
from dispatchers.bench.env import SPAWN, CpuClock, connect, fresh_schema, payload, run_id
from dispatchers.bench.measure import percentile, ratio
from dispatchers.bench.results import LatencyComparison, LatencyResult, LatencyRun
from dispatchers.runtime import loop as loops
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.log import NullLog
from outbox import Outbox

PRODUCER_RATE = 500.0
"""Most transactions per second one producer connection is asked for; a higher
offered rate is split over more producers, so that the rate is what is offered."""

START_TIMEOUT = 60.0
"""Seconds a process may take to start, and the dispatchers to settle who is on duty."""


def _produce(
    url: str,
    schema: str,
    target: str,
    prefix: str,
    rate: float,
    indexes: range,
    ready: Event,
    go: Event,
    out: str,
    local: bool,
) -> None:
    """One producer process: message ``i`` of ``indexes`` is committed, in its own
    transaction, at ``i / rate`` seconds after the start; writes the wall time
    (``time.time()``) right after each commit to ``out`` as JSON, and with ``local``
    (the server runs on this machine) the CPU its server process used meanwhile."""
    box = Outbox(schema=schema, notify=True)
    commits: dict[int, float] = {}
    late = 0.0
    with connect(url) as conn:
        backend = CpuClock(conn.info.backend_pid) if local else None
        # warm the connection and the statement cache; rolled back, never delivered
        box.enqueue(conn, url=target, idempotency_key=f"{prefix}warmup", json=payload(0))
        conn.rollback()
        ready.set()
        if not go.wait(START_TIMEOUT):
            raise RuntimeError("the benchmark never said go")
        start = time.monotonic()
        cpu_start = backend.read() if backend else None
        for i in indexes:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                late = max(late, -delay)
            box.enqueue(conn, url=target, idempotency_key=f"{prefix}{i}", json=payload(i))
            conn.commit()
            commits[i] = time.time()
        elapsed = time.monotonic() - start
        cpu_end = backend.read() if backend else None
    backend_cpu = None if cpu_start is None or cpu_end is None else cpu_end - cpu_start
    Path(out).write_text(
        json.dumps(
            {
                "commits": commits,
                "late_max_s": late,
                "elapsed": elapsed,
                "backend_cpu_s": backend_cpu,
            }
        )
    )


def _snapshot(dispatcher: Dispatcher) -> dict[str, Any]:
    st = dispatcher.stats
    waker = dispatcher.waker
    return {
        "cpu_s": time.process_time(),
        "claims": st.claims,
        "empty_claims": st.empty_claims,
        "delivered": st.delivered,
        "round_trips": dispatcher.round_trips,
        "notifications": waker.notifications if waker else 0,
        "on_duty": bool(waker and waker.on_duty),
    }


def _dispatch(url: str, config: DispatcherConfig, pipe: Connection) -> None:
    """One dispatcher process: runs until told ``"stop"``; answers ``"snapshot"``
    with its counters and CPU time so far."""

    async def main() -> None:
        dispatcher = Dispatcher(url, config, log=NullLog())
        task = asyncio.create_task(dispatcher.run())
        try:
            while True:
                command = await asyncio.to_thread(pipe.recv)
                if command == "stop":
                    break
                pipe.send(_snapshot(dispatcher))
        finally:
            dispatcher.stop()
            await task
            pipe.send(_snapshot(dispatcher))

    loops.run(main(), event_loop=config.event_loop)


class _Fleet:
    """The dispatcher processes of one run, and their pipes."""

    def __init__(self, url: str, config: DispatcherConfig, count: int) -> None:
        self.pipes: list[Connection] = []
        self.processes: list[SpawnProcess] = []
        for number in range(count):
            ours, theirs = SPAWN.Pipe()
            process = SPAWN.Process(
                target=_dispatch,
                args=(url, config, theirs),
                name=f"outbox-bench-dispatcher-{number}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)

    def snapshots(self) -> list[dict[str, Any]]:
        for pipe in self.pipes:
            pipe.send("snapshot")
        return [self._answer(pipe) for pipe in self.pipes]

    @staticmethod
    def _answer(pipe: Connection) -> dict[str, Any]:
        if not pipe.poll(START_TIMEOUT):
            raise RuntimeError("a dispatcher process stopped answering")
        answer: dict[str, Any] = pipe.recv()
        return answer

    def stop(self) -> list[dict[str, Any]]:
        finals = []
        for pipe in self.pipes:
            try:
                pipe.send("stop")
            except OSError:
                continue
        for pipe in self.pipes:
            with contextlib.suppress(RuntimeError, EOFError, OSError):
                finals.append(self._answer(pipe))
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(5)
        for pipe in self.pipes:
            pipe.close()
        return finals


def _settled(snapshots: list[dict[str, Any]]) -> bool:
    """Every dispatcher has claimed once, and exactly one of them is on duty."""
    return all(x["claims"] > 0 for x in snapshots) and sum(x["on_duty"] for x in snapshots) == 1


def _wait(condition: Callable[[], bool], within: float, pause: float = 0.05) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
    return True


def latency_run(bench: Bench, *, rate: float, dispatchers: int) -> LatencyRun:
    """One run at ``rate`` messages per second with ``dispatchers`` processes."""
    s = bench.settings
    receiver = bench.receiver
    duration = s.offered_seconds(LATENCY_SECONDS)
    count = max(1, round(rate * duration))
    producers = max(1, math.ceil(rate / PRODUCER_RATE))
    prefix = f"latency-{run_id()}-"
    failures: list[str] = []
    bench.progress(
        f"latency: {rate:g} msgs/s for {duration:g} s ({count:,} messages), "
        f"{dispatchers} dispatcher process{'es' if dispatchers > 1 else ''}"
    )
    start: list[dict[str, Any]] = []
    end: list[dict[str, Any]] = []
    pg_start: float | None = None
    pg_end: float | None = None
    with fresh_schema(bench.db.url) as schema, tempfile.TemporaryDirectory() as tmp:
        config = DispatcherConfig(
            schema=schema,
            concurrency=s.concurrency,
            batch_size=s.batch_size,
            allow_private_networks=True,
            listen=True,
            http_client=s.http_client or DispatcherConfig.http_client,
            event_loop=s.event_loop,
            claim_window=s.claim_window,
        )
        before = receiver.counts()
        fleet = _Fleet(bench.db.url, config, dispatchers)
        go = SPAWN.Event()
        outs = [str(Path(tmp) / f"commits-{p}.json") for p in range(producers)]
        readies = [SPAWN.Event() for _ in range(producers)]
        procs = [
            SPAWN.Process(
                target=_produce,
                args=(
                    bench.db.url,
                    schema,
                    receiver.url,
                    prefix,
                    rate,
                    range(p, count, producers),
                    readies[p],
                    go,
                    outs[p],
                    bench.pg_clock is not None,
                ),
                name=f"outbox-bench-producer-{p}",
                daemon=True,
            )
            for p in range(producers)
        ]
        for proc in procs:
            proc.start()
        try:
            # Settled: every dispatcher has claimed once, and one of them is on duty.
            settled = _wait(lambda: _settled(fleet.snapshots()), START_TIMEOUT, pause=0.1)
            if not settled or not all(r.wait(START_TIMEOUT) for r in readies):
                failures.append("the dispatchers or producers did not start")
            else:
                start = fleet.snapshots()
                pg_start = bench.pg_clock.read() if bench.pg_clock else None
                go.set()
                for proc in procs:
                    proc.join(duration * 2 + START_TIMEOUT)
                if any(proc.exitcode != 0 for proc in procs):
                    codes = [proc.exitcode for proc in procs]
                    failures.append(f"a producer failed (exit codes {codes})")
                elif not _wait(
                    lambda: (
                        sum(x["delivered"] for x in fleet.snapshots())
                        - sum(x["delivered"] for x in start)
                        >= count
                    ),
                    60.0,
                ):
                    failures.append("not every message delivered 60 s after the last commit")
                end = fleet.snapshots()
                pg_end = bench.pg_clock.read() if bench.pg_clock else None
        finally:
            fleet.stop()
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
                proc.join(10)
        produced = [json.loads(Path(o).read_text()) for o in outs if Path(o).exists()]
    after = receiver.counts()
    arrivals = receiver.arrivals(prefix)
    commits = {int(i): at for p in produced for i, at in p["commits"].items()}
    latencies_ms = [
        (arrivals[f"{prefix}{i}"] - at) * 1000
        for i, at in commits.items()
        if f"{prefix}{i}" in arrivals
    ]
    duplicates = after["duplicates"] - before["duplicates"]
    if produced and len(latencies_ms) != count:
        failures.append(f"receiver saw {len(latencies_ms)} of {count} messages")
    if duplicates:
        failures.append(f"receiver saw {duplicates} duplicate keys")

    def total(key: str) -> float | None:
        if not start or not end:
            return None
        return float(sum(e[key] for e in end) - sum(b[key] for b in start))

    delivered = total("delivered")
    claims = total("claims")

    def per_msg(value: float | None) -> float | None:
        return None if value is None or not delivered else value / delivered

    cpu_dispatchers = total("cpu_s")
    pg_cpu = None if pg_start is None or pg_end is None else pg_end - pg_start
    producers_cpu = [p.get("backend_cpu_s") for p in produced]
    enqueue_cpu = sum(producers_cpu) if produced and None not in producers_cpu else None
    elapsed = max((p["elapsed"] for p in produced), default=None)
    return LatencyRun(
        offered_rate=rate,
        dispatchers=dispatchers,
        producers=producers,
        duration_s=duration,
        messages=count,
        achieved_rate=count / elapsed if elapsed else None,
        producer_late_max_ms=max((p["late_max_s"] for p in produced), default=0.0) * 1000,
        delivered=int(delivered or 0),
        received=len(latencies_ms),
        duplicates=duplicates,
        p50_ms=percentile(latencies_ms, 50),
        p95_ms=percentile(latencies_ms, 95),
        p99_ms=percentile(latencies_ms, 99),
        max_ms=max(latencies_ms) if latencies_ms else None,
        cpu_dispatcher_us_per_msg=per_msg(
            None if cpu_dispatchers is None else cpu_dispatchers * 1e6
        ),
        cpu_postgres_us_per_msg=per_msg(None if pg_cpu is None else pg_cpu * 1e6),
        cpu_postgres_producers_us_per_msg=(
            None if enqueue_cpu is None or not commits else enqueue_cpu * 1e6 / len(commits)
        ),
        round_trips_per_msg=per_msg(total("round_trips")),
        claims_per_msg=per_msg(claims),
        empty_claim_share=None if not claims else (total("empty_claims") or 0) / claims,
        notifications_per_msg=per_msg(total("notifications")),
        ok=not failures,
        failures=failures,
    )


def pgqueuer_beside(bench: Bench, ours: LatencyRun) -> LatencyRun:
    """``ours`` with pgqueuer's latency at the same offered load beside it as
    ``baseline``, with the ratios ours / theirs (below 1: ours is lower)."""
    s = bench.settings
    if reason := pgqueuer.available():
        raise RuntimeError(f"--baseline pgqueuer: {reason}")
    rate = ours.offered_rate
    duration = ours.duration_s
    bench.progress(f"latency: pgqueuer {pgqueuer.version()}, {rate:g} msgs/s for {duration:g} s")
    theirs = pgqueuer.latency(
        bench.db.url,
        receiver=bench.receiver,
        pg_clock=bench.pg_clock,
        rate=rate,
        duration=duration,
        concurrency=s.concurrency,
    )
    comparison = LatencyComparison(
        theirs=theirs,
        p50_ratio=ratio(ours.p50_ms, theirs.p50_ms),
        p99_ratio=ratio(ours.p99_ms, theirs.p99_ms),
        cpu_dispatcher_us_per_msg_ratio=ratio(
            ours.cpu_dispatcher_us_per_msg, theirs.cpu_dispatcher_us_per_msg
        ),
        cpu_postgres_us_per_msg_ratio=ratio(
            ours.cpu_postgres_us_per_msg, theirs.cpu_postgres_us_per_msg
        ),
    )
    return dataclasses.replace(
        ours,
        baseline=comparison,
        failures=[*ours.failures, *(f"pgqueuer: {f}" for f in theirs.failures)],
        ok=ours.ok and theirs.ok,
    )


def latency(bench: Bench) -> LatencyResult:
    """Every (rate, dispatcher count) of the settings, rates outermost; with
    ``--baseline pgqueuer``, pgqueuer (one consumer) beside our run with the fewest
    dispatchers at each rate."""
    s = bench.settings
    runs: list[LatencyRun] = []
    for rate in s.rates:
        at_rate = [latency_run(bench, rate=rate, dispatchers=n) for n in s.dispatchers]
        if "pgqueuer" in s.baselines:
            fewest = min(at_rate, key=lambda r: r.dispatchers)
            at_rate[at_rate.index(fewest)] = pgqueuer_beside(bench, fewest)
        runs += at_rate
    failures = [f"{r.offered_rate:g}/s x{r.dispatchers}: {f}" for r in runs for f in r.failures]
    return LatencyResult(runs=runs, ok=not failures, failures=failures)
