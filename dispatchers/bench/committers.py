"""Business connections for the enqueue benchmarks, each in its own process.

:class:`Committers` starts N processes, one connection each, hands each a
:class:`CommitJob` per phase over a pipe and collects one :class:`CommitResult`
per connection. The business transaction is one INSERT, then by mode nothing
(``plain``), the least a durable outbox must write (``floor``), or
``Outbox.enqueue`` with or without NOTIFY.

Design: docs/explanation/design/benchmarks.md
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

import psycopg

from dispatchers.bench.env import SPAWN, bench_queries, connect, payload, run_id
from outbox import Outbox
from outbox.internal import DEFAULT_MAX_BODY_BYTES, encode_body

MODES = ("plain", "floor", "outbox", "outbox-no-notify")
TARGET = "http://127.0.0.1:9/orders"  # the enqueued messages' URL; nothing sends there
START_DELAY = 0.2  # seconds between handing out a job and its start, so all start together


@dataclass(frozen=True)
class CommitJob:
    """One phase for one connection: ``mode`` transactions from ``start_at`` (wall
    time) for ``seconds``; at ``rate`` per second if given (the ``phase``-th fraction
    of an interval late, so that connections sharing a rate interleave), else as
    fast as the connection goes."""

    mode: str
    start_at: float
    seconds: float
    rate: float | None = None
    phase: float = 0.0


@dataclass(frozen=True)
class CommitResult:
    """What one connection did in one phase. Latencies (paced jobs only) run to
    the end of the commit, from the transaction's start (``service_ms``) and from
    the time the schedule gave it (``scheduled_ms``: that includes waiting behind
    a slow predecessor, so an overloaded connection cannot hide its backlog)."""

    commits: int
    cpu_s: float
    service_ms: list[float] = field(default_factory=list)
    scheduled_ms: list[float] = field(default_factory=list)
    late_max_s: float = 0.0


class _Business:
    """The statements of one connection's business transaction."""

    def __init__(self, schema: str, number: int) -> None:
        queries = bench_queries(schema)
        self.insert = queries["business_insert"]
        self.floor = queries["floor_insert"]
        self.boxes = {
            "outbox": Outbox(schema=schema, notify=True),
            "outbox-no-notify": Outbox(schema=schema, notify=False),
        }
        self.prefix = f"commit-{run_id()}-{number}-"
        self.sequence = 0

    def transaction(self, conn: psycopg.Connection[Any], mode: str) -> None:
        self.sequence += 1
        n = self.sequence
        conn.execute(self.insert, {"customer_id": n % 1000, "amount_cents": 1299})
        if mode == "floor":
            body, _ = encode_body(
                json=payload(n), body=None, content_type=None, max_body_bytes=DEFAULT_MAX_BODY_BYTES
            )
            conn.execute(self.floor, {"payload": body})
        elif mode != "plain":
            self.boxes[mode].enqueue(
                conn, url=TARGET, idempotency_key=f"{self.prefix}{n}", json=payload(n)
            )
        conn.commit()


def _run_flat_out(
    conn: psycopg.Connection[Any], business: _Business, job: CommitJob
) -> CommitResult:
    time.sleep(max(0.0, job.start_at - time.time()))
    end = job.start_at + job.seconds
    commits = 0
    cpu = time.process_time()
    while time.time() < end:
        business.transaction(conn, job.mode)
        commits += 1
    return CommitResult(commits, time.process_time() - cpu)


def _run_paced(
    conn: psycopg.Connection[Any], business: _Business, job: CommitJob, rate: float
) -> CommitResult:
    count = max(1, round(job.seconds * rate))
    start = time.monotonic() + (job.start_at - time.time()) + job.phase / rate
    give_up = start + 3 * job.seconds + 5  # an overloaded database must not hang the bench
    service: list[float] = []
    scheduled: list[float] = []
    late = 0.0
    cpu = 0.0
    for i in range(count):
        due = start + i / rate
        now = time.monotonic()
        if now > give_up:
            break
        if due > now:
            time.sleep(due - now)
        else:
            late = max(late, now - due)
        cpu0 = time.process_time()
        began = time.monotonic()
        business.transaction(conn, job.mode)
        done = time.monotonic()
        cpu += time.process_time() - cpu0
        service.append((done - began) * 1000)
        scheduled.append((done - due) * 1000)
    return CommitResult(len(service), cpu, service, scheduled, late)


def _serve(url: str, schema: str, number: int, pipe: Connection) -> None:
    """One connection's process: answer each :class:`CommitJob` with a
    :class:`CommitResult` until it receives ``None``."""
    business = _Business(schema, number)
    with connect(url) as conn:
        pipe.send("ready")
        while (job := pipe.recv()) is not None:
            if job.rate is None:
                pipe.send(_run_flat_out(conn, business, job))
            else:
                pipe.send(_run_paced(conn, business, job, job.rate))


class Committers:
    """``count`` business connections in ``schema``, each in its own process; a
    context manager that always ends them."""

    def __init__(self, url: str, schema: str, count: int) -> None:
        self.url = url
        self.schema = schema
        self.count = count
        self._pipes: list[Connection] = []
        self._processes: list[Any] = []

    def __enter__(self) -> Committers:
        try:
            for number in range(self.count):
                ours, theirs = SPAWN.Pipe()
                process = SPAWN.Process(
                    target=_serve,
                    args=(self.url, self.schema, number, theirs),
                    name=f"outbox-bench-committer-{number}",
                    daemon=True,
                )
                process.start()
                theirs.close()
                self._pipes.append(ours)
                self._processes.append(process)
            for pipe in self._pipes:
                if not pipe.poll(60) or pipe.recv() != "ready":
                    raise RuntimeError("a business connection did not start")
        except BaseException:
            self._end()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end()

    def run(self, mode: str, seconds: float, *, rate: float | None = None) -> list[CommitResult]:
        """One phase on every connection at once; ``rate`` (transactions per second,
        shared evenly by the connections) paces it. Returns each connection's result."""
        start_at = time.time() + START_DELAY
        share = None if rate is None else rate / self.count
        for number, pipe in enumerate(self._pipes):
            pipe.send(CommitJob(mode, start_at, seconds, share, number / self.count))
        bound = START_DELAY + (4 * seconds if rate else seconds) + 60
        results = []
        for pipe in self._pipes:
            if not pipe.poll(bound):
                raise RuntimeError("a business connection stopped answering")
            results.append(pipe.recv())
        return results

    def _end(self) -> None:
        for pipe in self._pipes:
            with contextlib.suppress(OSError):  # that process is gone already
                pipe.send(None)
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)
        for pipe in self._pipes:
            pipe.close()
        self._pipes, self._processes = [], []
