"""Drain throughput: one in-process Dispatcher delivers a pre-enqueued backlog.

For each repetition: start a fast local receiver (``benchmarks/receiver.py``, its own
process, 127.0.0.1 only), migrate a fresh schema (dropped at the end), enqueue ``n``
messages to the receiver in a few large transactions (timed separately), then run
one ``Dispatcher`` with ``run(drain=True)`` and time it from start to drained. It
reports the drain rate, database round trips (statements) per delivered message,
batch sizes, what the receiver saw, and the CPU time spent per message by the
dispatcher, the receiver and PostgreSQL. It exits 1 unless every message was
delivered exactly once (messages table empty, ``n`` rows in delivered, ``n``
requests and no duplicate key at the receiver).

PostgreSQL CPU is measured only for the embedded server (the postmaster named in
its data directory's ``postmaster.pid`` and all its children, background
processes included); it is not measured with ``--database-url``.

    python benchmarks/drain.py                       # embedded server
    python benchmarks/drain.py --concurrency 128 --repeat 3
    python benchmarks/drain.py --database-url postgresql://localhost/app --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql
from receiver import ReceiverProcess

from dispatchers.config import DispatcherConfig
from dispatchers.log import NullLog
from dispatchers.pool import Dispatcher
from outbox import Outbox, migrate
from outbox.dsn import libpq_url, redact
from outbox.embedded import EmbeddedPostgres

ENQUEUE_COMMIT_EVERY = 5000
DRAIN_TIMEOUT = 600.0  # seconds; a drain that takes longer is a failure
CONNECT_TIMEOUT = 10  # seconds, for this script's own connections
STATEMENT_TIMEOUT = "60s"  # for this script's own statements


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection[Any]:
    """A connection for the benchmark's own work, with its waits bounded."""
    conn = psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT)
    conn.execute("SELECT set_config('statement_timeout', %s, false)", (STATEMENT_TIMEOUT,))
    if not autocommit:
        conn.commit()
    return conn


@dataclass(frozen=True)
class Database:
    url: str
    data_dir: Path | None  # the embedded server's data directory, else None


@contextmanager
def database(url: str | None) -> Iterator[Database]:
    """The given database, or a throwaway embedded server in a temporary directory."""
    if url:
        yield Database(libpq_url(url), None)
        return
    with tempfile.TemporaryDirectory(prefix="outbox-bench-") as tmp:
        server = EmbeddedPostgres(os.path.join(tmp, "pg"), delete=True)
        try:
            yield Database(server.url, server.path)
        finally:
            server.cleanup()


@contextmanager
def fresh_schema(url: str) -> Iterator[str]:
    schema = f"outbox_bench_{uuid.uuid4().hex[:12]}"
    migrate(url, schema=schema)
    try:
        yield schema
    finally:
        with connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def cpu_seconds(process: psutil.Process, *, with_children: bool = False) -> float:
    """User + system CPU of ``process`` (from /proc/<pid>/stat); with ``with_children``,
    also its live children and the children it has already reaped."""
    times = process.cpu_times()
    total = times.user + times.system
    if with_children:
        total += times.children_user + times.children_system
        for child in process.children(recursive=True):
            try:
                child_times = child.cpu_times()
            except psutil.NoSuchProcess:
                continue  # exited just now: counted in the parent's reaped-children times
            total += child_times.user + child_times.system
    return total


def postmaster(data_dir: Path | None) -> psutil.Process | None:
    """The embedded server's postmaster (first line of postmaster.pid), if known."""
    if data_dir is None:
        return None
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        return psutil.Process(pid)
    except (OSError, ValueError, psutil.Error):
        return None


def enqueue(url: str, schema: str, target: str, n: int) -> tuple[float, int]:
    """Write ``n`` messages in transactions of ``ENQUEUE_COMMIT_EVERY``; (seconds, txs)."""
    box = Outbox(schema=schema, notify=False)
    run_id = uuid.uuid4().hex[:8]
    transactions = 0
    with connect(url) as conn:
        started = time.perf_counter()
        for i in range(n):
            payload = {"order_id": i, "amount_cents": 1299, "currency": "EUR"}
            box.enqueue(conn, url=target, idempotency_key=f"drain-{run_id}-{i}", json=payload)
            if (i + 1) % ENQUEUE_COMMIT_EVERY == 0 or i + 1 == n:
                conn.commit()
                transactions += 1
        return time.perf_counter() - started, transactions


def count_rows(url: str, schema: str) -> tuple[int, int]:
    """(rows in messages, rows in delivered)."""
    with connect(url, autocommit=True) as conn:
        counts = []
        for table in ("messages", "delivered"):
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}.{}").format(
                    sql.Identifier(schema), sql.Identifier(table)
                )
            ).fetchone()
            counts.append(int(row[0]) if row else -1)
    return counts[0], counts[1]


async def drain(url: str, config: DispatcherConfig) -> tuple[Any, float, float]:
    """Run one dispatcher until drained; (stats, wall seconds, CPU seconds of this process)."""
    dispatcher = Dispatcher(url, config, log=NullLog())
    cpu0, wall0 = time.process_time(), time.perf_counter()
    async with asyncio.timeout(DRAIN_TIMEOUT):
        stats = await dispatcher.run(drain=True)
    return stats, time.perf_counter() - wall0, time.process_time() - cpu0


def run_once(db: Database, *, n: int, concurrency: int, batch_size: int) -> dict[str, Any]:
    with ReceiverProcess() as receiver, fresh_schema(db.url) as schema:
        enqueue_s, transactions = enqueue(db.url, schema, receiver.url, n)
        config = DispatcherConfig(
            schema=schema,
            concurrency=concurrency,
            batch_size=batch_size,
            allow_private_networks=True,
        )
        receiver_proc = psutil.Process(receiver.pid)
        pg = postmaster(db.data_dir)
        receiver_cpu0 = cpu_seconds(receiver_proc)
        pg_cpu0 = cpu_seconds(pg, with_children=True) if pg else None
        stats, seconds, dispatcher_cpu = asyncio.run(drain(db.url, config))
        receiver_cpu = cpu_seconds(receiver_proc) - receiver_cpu0
        pg_cpu = (
            cpu_seconds(pg, with_children=True) - pg_cpu0 if pg and pg_cpu0 is not None else None
        )
        received = receiver.stop()
        in_messages, in_delivered = count_rows(db.url, schema)

    delivered = stats.delivered

    def per(value: float) -> float | None:
        return value / delivered if delivered else None

    def us_per_msg(value: float | None) -> float | None:
        return value * 1e6 / delivered if delivered and value is not None else None

    failures = []
    if in_messages != 0:
        failures.append(f"{in_messages} rows left in messages")
    if in_delivered != n:
        failures.append(f"{in_delivered} rows in delivered, expected {n}")
    if received["requests"] != n:
        failures.append(f"receiver saw {received['requests']} requests, expected {n}")
    if received["duplicates"]:
        failures.append(f"receiver saw {received['duplicates']} duplicate keys")
    return {
        "messages": n,
        "enqueue_s": enqueue_s,
        "enqueue_per_s": n / enqueue_s,
        "enqueue_transactions": transactions,
        "seconds": seconds,
        "msgs_per_s": delivered / seconds,
        "delivered": delivered,
        "retried": stats.retried,
        "dead": stats.dead,
        "lease_lost": stats.lease_lost,
        "db_errors": stats.db_errors,
        "round_trips": stats.round_trips,
        "round_trips_per_msg": per(stats.round_trips),
        "claims": stats.claims,
        "flushes": stats.flushes,
        "renewals": stats.renewals,
        "msgs_per_claim": delivered / stats.claims if stats.claims else None,
        "msgs_per_flush": delivered / stats.flushes if stats.flushes else None,
        "receiver_requests": received["requests"],
        "receiver_distinct_keys": received["distinct_keys"],
        "receiver_duplicates": received["duplicates"],
        "receiver_connections": received["connections"],
        "cpu_dispatcher_s": dispatcher_cpu,
        "cpu_receiver_s": receiver_cpu,
        "cpu_postgres_s": pg_cpu,
        "cpu_dispatcher_us_per_msg": us_per_msg(dispatcher_cpu),
        "cpu_receiver_us_per_msg": us_per_msg(receiver_cpu),
        "cpu_postgres_us_per_msg": us_per_msg(pg_cpu),
        "rows_in_messages": in_messages,
        "rows_in_delivered": in_delivered,
        "ok": not failures,
        "failures": failures,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def print_run(i: int, r: dict[str, Any]) -> None:
    print(f"run {i}")
    print(
        f"  enqueue    {r['messages']} msgs in {r['enqueue_s']:.2f} s "
        f"({r['enqueue_per_s']:,.0f} msgs/s, {r['enqueue_transactions']} transactions)"
    )
    print(
        f"  drain      {r['delivered']} msgs in {r['seconds']:.2f} s = "
        f"{r['msgs_per_s']:,.0f} msgs/s   (retried {r['retried']}, dead {r['dead']}, "
        f"lease lost {r['lease_lost']}, db errors {r['db_errors']})"
    )
    print(
        f"  database   {r['round_trips']} round trips = "
        f"{_fmt(r['round_trips_per_msg'], '.4f')} per msg   claims {r['claims']} "
        f"({_fmt(r['msgs_per_claim'], '.1f')} msgs/claim)   flushes {r['flushes']} "
        f"({_fmt(r['msgs_per_flush'], '.1f')} msgs/flush)   renewals {r['renewals']}"
    )
    print(
        f"  receiver   {r['receiver_requests']} requests, {r['receiver_distinct_keys']} "
        f"distinct keys, {r['receiver_duplicates']} duplicates, "
        f"{r['receiver_connections']} connections"
    )
    print(
        f"  CPU        dispatcher {r['cpu_dispatcher_s']:.2f} s "
        f"({_fmt(r['cpu_dispatcher_us_per_msg'], '.0f')} us/msg)   "
        f"receiver {r['cpu_receiver_s']:.2f} s "
        f"({_fmt(r['cpu_receiver_us_per_msg'], '.0f')} us/msg)   "
        + (
            "postgres not measured (external server)"
            if r["cpu_postgres_s"] is None
            else f"postgres {r['cpu_postgres_s']:.2f} s ({r['cpu_postgres_us_per_msg']:.0f} us/msg)"
        )
    )
    verdict = "ok" if r["ok"] else "FAILED: " + "; ".join(r["failures"])
    print(
        f"  check      messages {r['rows_in_messages']}, delivered {r['rows_in_delivered']}: "
        f"{verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        help="PostgreSQL URL (default: a throwaway embedded server via outbox.embedded)",
    )
    parser.add_argument("-n", type=int, default=20_000, help="messages (default 20000)")
    parser.add_argument(
        "--concurrency", type=int, default=64, help="dispatcher concurrency (default 64)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=100, help="dispatcher claim batch (default 100)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if min(args.n, args.concurrency, args.batch_size, args.repeat) < 1:
        parser.error("-n, --concurrency, --batch-size and --repeat must be positive")

    with database(args.database_url) as db:
        where = redact(db.url) if args.database_url else "embedded server (Unix socket)"
        runs = [
            run_once(db, n=args.n, concurrency=args.concurrency, batch_size=args.batch_size)
            for _ in range(args.repeat)
        ]

    rates = [r["msgs_per_s"] for r in runs]
    ok = all(r["ok"] for r in runs)
    header = {
        "n": args.n,
        "concurrency": args.concurrency,
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "python": sys.version.split()[0],
        "psycopg": psycopg.__version__,
        "db": where,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(
            json.dumps(
                {**header, "median_msgs_per_s": statistics.median(rates), "ok": ok, "runs": runs}
            )
        )
    else:
        print(
            f"drain: n={args.n} concurrency={args.concurrency} batch_size={args.batch_size} "
            f"python={header['python']} psycopg={header['psycopg']} db={where} "
            f"cpus={header['cpus']}"
        )
        for i, r in enumerate(runs, 1):
            print_run(i, r)
        if len(runs) > 1:
            print(
                f"median {statistics.median(rates):,.0f} msgs/s "
                f"(min {min(rates):,.0f}, max {max(rates):,.0f})"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
