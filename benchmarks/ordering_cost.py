"""What ordering keys cost a producer: the time of one ``enqueue`` inside an open
transaction without an ordering key, with one (it takes the key's advisory lock,
``sql/queries/enqueue.sql``, "ordered"), and with two producers on one key, each
committing at once, where the second waits for the first's commit.

Each transaction is one ``enqueue`` and its COMMIT, on its own connection per
producer; the variants alternate in rounds, so they share whatever else the
machine does. Printed: the median and p99 of the ``enqueue`` call and the
transactions a second of the whole, per variant.

    python benchmarks/ordering_cost.py [--database-url URL] [-n 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

import psycopg

from dispatchers.bench.env import database, fresh_schema
from outbox import Outbox


def producer(
    url: str, schema: str, keys: list[str], ordering_key: str | None, out: list[float]
) -> None:
    """Enqueue one message per transaction, one per key; note each call's time."""
    box = Outbox(schema=schema)
    with psycopg.connect(url) as conn:
        for key in keys:
            began = time.perf_counter()
            box.enqueue(
                conn,
                url="https://api.example.com/x",
                idempotency_key=key,
                json={},
                ordering_key=ordering_key,
            )
            out.append(time.perf_counter() - began)
            conn.commit()


def variant(url: str, schema: str, name: str, n: int, round_: int) -> dict[str, Any]:
    """``n`` transactions of one variant; the calls' times and the rate."""
    plans: dict[str, list[str | None]] = {
        "no key": [None],
        "a key": ["acct-1"],
        "two producers, one key": ["acct-2", "acct-2"],
        "two producers, two keys": ["acct-3", "acct-4"],
    }
    keys = plans[name]
    share = n // len(keys)
    times: list[list[float]] = [[] for _ in keys]
    threads = [
        threading.Thread(
            target=producer,
            args=(
                url,
                schema,
                [f"{name}-{round_}-{i}-{j}" for j in range(share)],
                key,
                times[i],
            ),
        )
        for i, key in enumerate(keys)
    ]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    calls = sorted(t for each in times for t in each)
    return {"calls": calls, "tx_per_s": len(calls) / elapsed}


VARIANTS = ("no key", "a key", "two producers, two keys", "two producers, one key")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="default: a throwaway embedded server")
    parser.add_argument("-n", type=int, default=2000, help="transactions per variant and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with database(args.database_url) as db, fresh_schema(db.url) as schema:
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        for round_ in range(args.rounds):
            for name in VARIANTS:
                results[name].append(variant(db.url, schema, name, args.n, round_))
    print(f"{'variant':<26} {'median us':>10} {'p99 us':>10} {'tx/s':>8}")
    for name in VARIANTS:
        calls = sorted(t for r in results[name] for t in r["calls"])
        median = statistics.median(calls) * 1e6
        p99 = calls[min(len(calls) - 1, int(len(calls) * 0.99))] * 1e6
        rate = statistics.median(r["tx_per_s"] for r in results[name])
        print(f"{name:<26} {median:>10.0f} {p99:>10.0f} {rate:>8.0f}")


if __name__ == "__main__":
    main()
