"""Median time of one ``publish`` inside an open transaction, by the number of
subscribed endpoints (default 1, 10 and 100).

    python benchmarks/publish_cost.py [--database-url URL] [-n 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

from dispatchers.bench.env import database, fresh_schema
from outbox import Outbox
from outbox.endpoints import Endpoints


def measure(url: str, endpoints: int, n: int) -> tuple[float, float]:
    with fresh_schema(url) as schema, psycopg.connect(url) as conn:
        registry = Endpoints(schema=schema)
        for i in range(endpoints):
            registry.add(conn, url=f"https://hooks.example.com/{i}", event_types=["order.*"])
        conn.commit()
        box = Outbox(schema=schema)
        samples: list[float] = []
        for i in range(n):
            start = time.perf_counter_ns()
            box.publish(conn, "order.created", {"order_id": i}, idempotency_key=f"o-{i}")
            samples.append((time.perf_counter_ns() - start) / 1000)
            if i % 100 == 99:
                conn.commit()
        conn.commit()
        samples.sort()
        return statistics.median(samples), samples[int(len(samples) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("-n", type=int, default=2000, help="publishes per size")
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1, 10, 100])
    args = parser.parse_args()
    with database(args.database_url) as db:
        print(f"{'endpoints':>9}  {'median us':>9}  {'p99 us':>8}  {'us/endpoint':>11}")
        for count in args.endpoints:
            median, p99 = measure(db.url, count, args.n)
            print(f"{count:>9}  {median:>9.0f}  {p99:>8.0f}  {median / count:>11.1f}")


if __name__ == "__main__":
    main()
