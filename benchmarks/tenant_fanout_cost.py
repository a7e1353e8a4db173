"""What one ``publish`` for a tenant costs as the number of tenants grows: a
schema with 10 endpoints in all (one tenant's) against one with ``--tenants``
tenants of ``--per-tenant`` endpoints each (100,000 endpoints by default), the
publish for one tenant of each, and, in the large schema, a publish for no
tenant to 10 endpoints of the operator's own.

Each call runs in a transaction of its own (committed), as an application's
would. Printed per case: the server's CPU per call (the backend's, from
``/proc/<pid>/schedstat``, so that the machine's other work does not count) and
the median wall time per call. The cases take turns, a round of ``--round``
calls each, so that load from elsewhere falls on all alike.

    python benchmarks/tenant_fanout_cost.py [--database-url URL] [-n 3000] [--round 100]
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

from dispatchers.bench.env import database, fresh_schema
from outbox import Outbox, Tenants
from outbox.endpoints import Endpoints

PAYLOAD = {"order_id": 42, "customer": "ada", "total_cents": 4200, "currency": "EUR"}
Conn = psycopg.Connection[Any]
Call = Callable[[Conn, int], object]


def backend_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def measure(conn: Conn, call: Call, start: int, count: int) -> list[tuple[float, float]]:
    """Run ``count`` calls, each committed: the (server ns, wall s) of each."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = int(row[0])
    conn.commit()
    samples = []
    for i in range(start, start + count):
        server0, wall0 = backend_ns(pid), time.perf_counter()
        call(conn, i)
        conn.commit()
        samples.append((backend_ns(pid) - server0, time.perf_counter() - wall0))
    return samples


def populate(conn: Conn, schema: str, tenants: int, per_tenant: int) -> None:
    """``tenants`` tenants t-1.. of ``per_tenant`` endpoints each, in bulk, and
    10 endpoints of no tenant; each endpoint with a signing secret, as added."""
    target = sql.Identifier(schema)
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.tenants (external_id) SELECT 't-' || g FROM generate_series(1, %s) AS g"
        ).format(target),
        (tenants,),
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {0}.endpoints (url, tenant_id)"
            " SELECT 'https://hooks.example.com/' || t.id || '/' || g, t.id"
            " FROM {0}.tenants AS t CROSS JOIN generate_series(1, %s) AS g"
        ).format(target),
        (per_tenant,),
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {0}.endpoint_secrets (endpoint_id, secret)"
            " SELECT id, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw' FROM {0}.endpoints"
        ).format(target)
    )
    for i in range(10):
        Endpoints(schema=schema).add(conn, url=f"https://operator.example.com/{i}")
    conn.execute(sql.SQL("ANALYZE {}.endpoints").format(target))
    conn.execute(sql.SQL("ANALYZE {}.tenants").format(target))
    conn.commit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: a throwaway embedded server")
    parser.add_argument("-n", type=int, default=3000, help="calls per case (default 3000)")
    parser.add_argument("--round", type=int, default=100, help="calls per turn (default 100)")
    parser.add_argument("--tenants", type=int, default=10_000, help="default 10000")
    parser.add_argument("--per-tenant", type=int, default=10, help="default 10")
    args = parser.parse_args()
    with (
        database(args.database_url) as db,
        fresh_schema(db.url) as small,
        fresh_schema(db.url) as large,
        psycopg.connect(db.url) as conn,
    ):
        with conn.transaction():
            Tenants(schema=small).add(conn, "t-1")
            for i in range(10):
                Endpoints(schema=small).add(
                    conn, url=f"https://hooks.example.com/{i}", tenant="t-1"
                )
        started = time.perf_counter()
        populate(conn, large, args.tenants, args.per_tenant)
        endpoints = args.tenants * args.per_tenant
        print(
            f"made {args.tenants:,} tenants of {args.per_tenant} endpoints each "
            f"({endpoints:,} endpoints) in {time.perf_counter() - started:.1f} s"
        )
        version = conn.execute("SHOW server_version").fetchone()
        jit = conn.execute("SHOW jit").fetchone()
        conn.commit()
        print(f"PostgreSQL {version[0] if version else '?'}, jit {jit[0] if jit else '?'}")
        small_box, large_box = Outbox(schema=small), Outbox(schema=large)
        middle = f"t-{args.tenants // 2}"
        cases: dict[str, Call] = {
            "10 endpoints in all, publish for their tenant": lambda c, i: small_box.publish(
                c, "order.paid", PAYLOAD, idempotency_key=f"k{i}", tenant="t-1"
            ),
            f"{endpoints:,} endpoints, publish for one tenant": lambda c, i: large_box.publish(
                c, "order.paid", PAYLOAD, idempotency_key=f"k{i}", tenant=middle
            ),
            f"{endpoints:,} endpoints, publish for no tenant": lambda c, i: large_box.publish(
                c, "order.paid", PAYLOAD, idempotency_key=f"k{i}"
            ),
        }
        written = {name: len(call(conn, 10**8)) for name, call in cases.items()}  # type: ignore[arg-type]
        conn.rollback()
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for warm in range(20):  # plans cached, pages in memory
            for call in cases.values():
                measure(conn, call, 10**7 + warm, 1)
        for start in range(0, args.n, args.round):
            for name, call in cases.items():
                results[name] += measure(conn, call, start, args.round)
        print(f"{'case':58} {'messages':>8} {'server µs/call':>15} {'wall µs (median)':>17}")
        baseline = None
        for name, samples in results.items():
            server = sum(s[0] for s in samples) / len(samples) / 1000
            wall = statistics.median(s[1] for s in samples) * 1e6
            baseline = baseline or server
            print(
                f"{name:58} {written[name]:8} {server:15.1f} {wall:17.1f}"
                f"   ({server / baseline:.2f}x the first, server CPU)"
            )


if __name__ == "__main__":
    main()
