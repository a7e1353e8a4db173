"""Latency of ``Outbox.enqueue`` on one psycopg connection, with and without NOTIFY.

Migrates a fresh schema (dropped at the end), then times ``n`` enqueues with unique
keys and a small JSON body. The transaction is committed every ``--batch`` enqueues:
a realistic transaction size, and the only way to include what NOTIFY really costs
(PostgreSQL serialises the commits of notifying transactions). Per-call latency is
the enqueue call alone; throughput is enqueues per second of wall time, commits
included.

    python benchmarks/enqueue_latency.py                       # embedded server
    python benchmarks/enqueue_latency.py --no-notify -n 20000
    python benchmarks/enqueue_latency.py --database-url postgresql://localhost/app
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from outbox import Outbox, migrate
from outbox.dsn import libpq_url, redact
from outbox.embedded import EmbeddedPostgres

URL = "https://example.com/webhooks/orders"


@contextmanager
def database(url: str | None) -> Iterator[str]:
    """The given database, or a throwaway embedded server in a temporary directory."""
    if url:
        yield libpq_url(url)
        return
    with tempfile.TemporaryDirectory(prefix="outbox-bench-") as tmp:
        server = EmbeddedPostgres(os.path.join(tmp, "pg"), delete=True)
        try:
            yield server.url
        finally:
            server.cleanup()


@contextmanager
def fresh_schema(url: str) -> Iterator[str]:
    schema = f"outbox_bench_{uuid.uuid4().hex[:12]}"
    migrate(url, schema=schema)
    try:
        yield schema
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def run(url: str, *, n: int, batch: int, notify: bool, warmup: int) -> dict[str, float]:
    with fresh_schema(url) as schema, psycopg.connect(url) as conn:
        box = Outbox(schema=schema, notify=notify)
        run_id = uuid.uuid4().hex[:8]

        for i in range(warmup):  # connection and statement caches; not kept
            box.enqueue(conn, url=URL, idempotency_key=f"warmup-{run_id}-{i}", json={"i": i})
        conn.rollback()

        latencies = [0] * n
        commit_ns: list[int] = []
        clock = time.perf_counter_ns
        started = clock()
        for i in range(n):
            payload = {"order_id": i, "amount_cents": 1299, "currency": "EUR"}
            t0 = clock()
            box.enqueue(conn, url=URL, idempotency_key=f"order-{run_id}-{i}", json=payload)
            latencies[i] = clock() - t0
            if (i + 1) % batch == 0 or i + 1 == n:
                t0 = clock()
                conn.commit()
                commit_ns.append(clock() - t0)
        wall_s = (clock() - started) / 1e9

        stored = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.messages").format(sql.Identifier(schema))
        ).fetchone()
        conn.rollback()
        if stored != (n,):
            raise SystemExit(f"expected {n} messages, found {stored}")

    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "median_us": statistics.median(latencies) / 1e3,
        "p90_us": cuts[89] / 1e3,
        "p99_us": cuts[98] / 1e3,
        "max_us": max(latencies) / 1e3,
        "commit_mean_ms": statistics.fmean(commit_ns) / 1e6,
        "enqueues_per_s": n / wall_s,
        "wall_s": wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        help="PostgreSQL URL (default: a throwaway embedded server via outbox.embedded)",
    )
    parser.add_argument("-n", type=int, default=10_000, help="enqueues to time (default 10000)")
    parser.add_argument(
        "--batch", type=int, default=1000, help="commit every N enqueues (default 1000)"
    )
    parser.add_argument(
        "--notify",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Outbox(notify=...): one NOTIFY per transaction (default: on)",
    )
    parser.add_argument(
        "--warmup", type=int, default=200, help="untimed enqueues first (default 200)"
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.batch < 1 or args.warmup < 0:
        parser.error("-n and --batch must be positive, --warmup not negative")

    with database(args.database_url) as url:
        where = redact(url) if args.database_url else "embedded server (Unix socket)"
        result = run(url, n=args.n, batch=args.batch, notify=args.notify, warmup=args.warmup)

    print(
        f"enqueue latency: n={args.n} batch={args.batch} notify={args.notify} "
        f"python={sys.version.split()[0]} psycopg={psycopg.__version__} db={where}"
    )
    print(
        f"  median {result['median_us']:.1f} us   p90 {result['p90_us']:.1f} us   "
        f"p99 {result['p99_us']:.1f} us   max {result['max_us']:.1f} us"
    )
    print(
        f"  commit (per {args.batch}) mean {result['commit_mean_ms']:.2f} ms   "
        f"throughput {result['enqueues_per_s']:,.0f} enqueues/s "
        f"({args.n} in {result['wall_s']:.2f} s, commits included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
