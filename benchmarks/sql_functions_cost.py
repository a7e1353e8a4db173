"""What a message costs written by the SQL functions (migration 0022) against the
library: ``SELECT outbox.enqueue(...)`` against ``Outbox.enqueue``, and
``SELECT outbox.publish(...)`` against ``Outbox.publish`` to 10 subscribed
endpoints, each call in a transaction of its own (committed).

For each, the server's CPU per call (the backend's, from ``/proc/<pid>/schedstat``
in nanoseconds, so that the machine's other work does not count), this process's
CPU per call (the library's checks and encoding, or only the driver's work for
the functions) and the median wall time per call. The two sides take turns, a
round of ``--round`` calls each, so that load from elsewhere falls on both alike.

    python benchmarks/sql_functions_cost.py [--database-url URL] [-n 4000] [--round 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from dispatchers.bench.env import database, fresh_schema
from outbox import Outbox
from outbox.endpoints import Endpoints

PAYLOAD = {"order_id": 42, "customer": "ada", "total_cents": 4200, "currency": "EUR"}
Call = Callable[[psycopg.Connection[Any], int], object]


def backend_ns(conn: psycopg.Connection[Any], pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def measure(conn: psycopg.Connection[Any], call: Call, start: int, count: int) -> list[float]:
    """Run ``count`` calls, each committed; the (server ns, client s, wall s) of each."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = int(row[0])
    conn.commit()
    samples = []
    for i in range(start, start + count):
        server0, client0, wall0 = backend_ns(conn, pid), time.process_time(), time.perf_counter()
        call(conn, i)
        conn.commit()
        samples.append(
            (
                backend_ns(conn, pid) - server0,
                time.process_time() - client0,
                time.perf_counter() - wall0,
            )
        )
    return samples  # type: ignore[return-value]


def sides(schema: str) -> dict[str, dict[str, Call]]:
    box = Outbox(schema=schema)
    target = sql.Identifier(schema)
    enqueue_sql = sql.SQL(
        "SELECT {}.enqueue(url => %s, idempotency_key => %s, json_body => %s)"
    ).format(target)
    publish_sql = sql.SQL(
        "SELECT {}.publish(event_type => 'order.paid', payload => %s, idempotency_key => %s)"
    ).format(target)
    url = "https://payments.example.com/charges"
    return {
        "enqueue": {
            "library": lambda c, i: box.enqueue(c, url=url, idempotency_key=f"l{i}", json=PAYLOAD),
            "sql": lambda c, i: c.execute(enqueue_sql, (url, f"s{i}", Jsonb(PAYLOAD))).fetchone(),
        },
        "publish (10 endpoints)": {
            "library": lambda c, i: box.publish(c, "order.paid", PAYLOAD, idempotency_key=f"l{i}"),
            "sql": lambda c, i: c.execute(publish_sql, (Jsonb(PAYLOAD), f"s{i}")).fetchone(),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: a throwaway embedded server")
    parser.add_argument("-n", type=int, default=4000, help="calls per side (default 4000)")
    parser.add_argument("--round", type=int, default=200, help="calls per turn (default 200)")
    args = parser.parse_args()
    with (
        database(args.database_url) as db,
        fresh_schema(db.url) as schema,
        psycopg.connect(db.url) as conn,
    ):
        for i in range(10):
            Endpoints(schema=schema).add(conn, url=f"https://hooks.example.com/{i}")
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        conn.commit()
        version = conn.execute("SHOW server_version").fetchone()
        jit = conn.execute("SHOW jit").fetchone()
        print(f"PostgreSQL {version[0] if version else '?'}, jit {jit[0] if jit else '?'}")
        print(f"{'':24} {'side':8} {'server µs/call':>15} {'client µs/call':>15} "
              f"{'wall µs (median)':>17}")  # fmt: skip
        for name, pair in sides(schema).items():
            results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in pair}
            for warm in range(10):  # warm both: plans cached, pages in memory
                for call in pair.values():
                    measure(conn, call, 10**7 + warm, 1)
            for start in range(0, args.n, args.round):
                for side, call in pair.items():
                    results[side] += measure(conn, call, start, args.round)  # type: ignore[arg-type]
            for side, samples in results.items():
                server = sum(s[0] for s in samples) / len(samples) / 1000
                client = sum(s[1] for s in samples) / len(samples) * 1e6
                wall = statistics.median(s[2] for s in samples) * 1e6
                print(f"{name:24} {side:8} {server:15.1f} {client:15.1f} {wall:17.1f}")


if __name__ == "__main__":
    main()
