"""One dispatcher process serving two databases: its throughput against one
database's, and how long a small database waits while another has a backlog.

The two databases are two schemas of one server (a throwaway embedded one unless
``--database-url`` names one), so they share its CPU as shards on one host would;
each gets its own dispatcher in the process (``dispatchers.runtime.fleet``), with
the process's ``--concurrency`` shared between them.

- **throughput**: one process drains ``2n`` messages from one database, then ``n``
  from each of two (the same work), to the fast bench receiver; rounds alternate
  the two. Printed: messages/s of each, the median over rounds.
- **fairness**: the receiver answers after ``--delay`` seconds; one database has a
  backlog of ``--backlog`` messages, and once it is being sent the other gets
  ``--small`` messages, enqueued as an application does (its commit notifies).
  Printed: how long the small database took to drain, how
  much of the backlog was left then, and how long the backlog took in all (what
  the small one would have waited behind it, served first come, first served).

    python benchmarks/many_databases.py [--database-url URL] [-n 5000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time
from contextlib import ExitStack

import psycopg

from dispatchers.bench.env import (
    database,
    fresh_schema,
    payload,
    row_counts,
    run_id,
    seed_backlog,
)
from dispatchers.bench.receiver import Replies
from dispatchers.bench.receiver_process import ReceiverProcess
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.databases import Served, default_label
from dispatchers.runtime.dispatcher import Dispatcher
from dispatchers.runtime.fleet import Fleet
from dispatchers.runtime.log import NullLog
from outbox import Outbox

POLL = 0.01
"""Seconds between two looks at the small database's backlog."""


def seed(url: str, schema: str, target: str, count: int, tag: str) -> None:
    seed_backlog(
        url, schema, targets=[target], keys=[f"{tag}-{run_id()}-{i}" for i in range(count)]
    )


def publish(url: str, schema: str, target: str, count: int) -> None:
    """``count`` messages in one transaction, as an application enqueues them (its
    commit wakes the dispatcher on duty)."""
    box = Outbox(schema=schema)
    tag = run_id()
    with psycopg.connect(url) as conn, conn.transaction():
        for i in range(count):
            box.enqueue(conn, url=target, idempotency_key=f"small-{tag}-{i}", json=payload(i))


async def drain_one(url: str, schema: str, config: DispatcherConfig) -> None:
    dispatcher = Dispatcher(url, dataclasses.replace(config, schema=schema), log=NullLog())
    await dispatcher.run(drain=True)


async def drain_many(databases: list[Served], config: DispatcherConfig) -> None:
    await Fleet(databases, config, log=NullLog()).run(drain=True)


def throughput(
    url: str, schemas: list[str], target: str, n: int, config: DispatcherConfig, round_: int
) -> tuple[float, float]:
    """Messages/s draining ``2n`` from one database, and ``n`` from each of two."""
    rates: dict[str, float] = {}
    order = ("one", "two") if round_ % 2 == 0 else ("two", "one")
    for case in order:
        if case == "one":
            seed(url, schemas[0], target, 2 * n, "one")
            began = time.perf_counter()
            asyncio.run(drain_one(url, schemas[0], config))
        else:
            for schema in schemas:
                seed(url, schema, target, n, "two")
            began = time.perf_counter()
            served = [Served(url, s, default_label(url, s)) for s in schemas]
            asyncio.run(drain_many(served, config))
        rates[case] = 2 * n / (time.perf_counter() - began)
    return rates["one"], rates["two"]


async def fairness(
    url: str, schemas: list[str], target: str, config: DispatcherConfig, backlog: int, small: int
) -> tuple[float, int, float]:
    """(seconds the small database took to drain, the backlog left then, seconds
    the backlog took in all)."""
    big, little = schemas
    await asyncio.to_thread(seed, url, big, target, backlog, "big")
    fleet = Fleet([Served(url, s, default_label(url, s)) for s in schemas], config, log=NullLog())
    began = time.perf_counter()
    # not a drain: the small database's would end at once, before it has messages
    task = asyncio.create_task(fleet.run())
    deadline = began + 600

    async def left(schema: str) -> int:
        if time.perf_counter() > deadline or task.done():
            fleet.stop()
            raise SystemExit(f"{schema} was not drained within 600 s")
        await asyncio.sleep(POLL)
        return (await asyncio.to_thread(row_counts, url, schema)).messages

    try:
        while await left(big) > backlog * 0.9:
            pass
        await asyncio.to_thread(publish, url, little, target, small)
        since = time.perf_counter()
        while await left(little):
            pass
        waited = time.perf_counter() - since
        remaining = (await asyncio.to_thread(row_counts, url, big)).messages
        while await left(big):
            pass
        total = time.perf_counter() - began
    finally:
        fleet.stop()
        await task
    return waited, remaining, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="default: a throwaway embedded server")
    parser.add_argument("-n", type=int, default=5000, help="messages per database per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--backlog", type=int, default=3000, help="the big database's backlog")
    parser.add_argument("--small", type=int, default=50, help="the small database's messages")
    parser.add_argument("--delay", type=float, default=0.05, help="receiver's answer delay, s")
    args = parser.parse_args()
    config = DispatcherConfig(allow_private_networks=True, concurrency=args.concurrency)
    with ExitStack() as stack:
        db = stack.enter_context(database(args.database_url))
        schemas = [stack.enter_context(fresh_schema(db.url, "outbox_many")) for _ in range(2)]
        with ReceiverProcess(record_keys=False) as fast:
            rates = [
                throughput(db.url, schemas, fast.url, args.n, config, r) for r in range(args.rounds)
            ]
        with ReceiverProcess(record_keys=False, replies=Replies(delay=args.delay)) as slow:
            waited, left, total = asyncio.run(
                fairness(db.url, schemas, slow.url, config, args.backlog, args.small)
            )
    one = statistics.median(r[0] for r in rates)
    two = statistics.median(r[1] for r in rates)
    print(f"concurrency {args.concurrency}, {2 * args.n} messages per drain, {args.rounds} rounds")
    print(f"{'one database':<28} {one:>8.0f} messages/s")
    print(f"{'two databases, one process':<28} {two:>8.0f} messages/s ({two / one:.2f}x)")
    print(
        f"fairness (receiver {args.delay:g} s): the small database's {args.small} drained in "
        f"{waited:.2f} s with {left} of the {args.backlog} backlog left; the backlog took "
        f"{total:.2f} s in all"
    )


if __name__ == "__main__":
    main()
