"""PostgreSQL CPU per message of the dispatcher's drain statements, without HTTP.

Seeds ``-n`` ready messages in a fresh schema, then drives ``Store.claim`` and
``Store.complete`` (every outcome a success) directly, ``k`` messages per
statement for each batch size, and prints the server's CPU per message spent in
claim and in complete, the VACUUM that cleans up after them, and a heartbeat
(``Store.renew``) of 64 held leases. CPU is read per backend from
``/proc/<pid>/schedstat`` (nanoseconds, so single statements are resolved), not
from wall time: the machine may be busy with other work. Autovacuum is off on
the benchmark's tables so that the cleanup is the explicit, measured VACUUM.

Then the cost of parsing and planning alone: each statement under ``EXPLAIN``
(planned, never run), the backend's CPU per statement and the planner's own
"Planning Time".

``--against VERSION`` also drains a schema migrated only up to that migration
(rows marked ``vNNNN``), the two taking turns statement by statement so that
load from other work falls on both alike: a schema change measured against the
schema before it. This tree's statements run on 0006 (signing secrets in a table
of their own) and later.

    python benchmarks/sql_cost.py [--database-url URL] [-n 20000] [--batch 10 30 100]
                                  [--against 6]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from dispatchers.bench.env import connect, database, fresh_schema, postgres_clock, seed_backlog
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.store.postgres import Completion, Store
from outbox._queries import Statement

TABLES = ("messages", "delivered", "attempts", "message_keys", "destination_slots", "endpoints")
OWNER = "sql-cost:1:bench"
HELD = 64
RENEWALS = 200
EXPLAINS = 200


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


class ServerCpu:
    """Nanoseconds of CPU used by the server's processes alive when it was made
    (the benchmark's backends and the background processes)."""

    def __init__(self, postmaster: int) -> None:
        self.pids = [postmaster, *_children(postmaster)]
        self.last: dict[int, int] = {}

    def read(self) -> int:
        for pid in self.pids:
            # a process that exited since (a closed connection's backend) keeps
            # the last figure read, so that a difference never goes negative
            with suppress(OSError):
                self.last[pid] = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
        return sum(self.last.values())


def _success(
    message_id: int, attempt: int, started: datetime, endpoint_id: int | None = None
) -> Completion:
    return Completion(
        id=message_id,
        attempt=attempt,
        state="delivered",
        outcome="delivered",
        sent=True,
        status=200,
        started_at=started,
        duration_ms=3,
        endpoint_id=endpoint_id,
    )


def _successes(jobs: list[Any], started: datetime) -> list[Completion]:
    return [_success(j.id, j.attempts, started, j.endpoint_id) for j in jobs]


def _migrated(url: str, version: int | None) -> AbstractContextManager[str]:
    """A fresh schema, migrated fully or only up to ``version``; dropped after."""
    prefix = "sql_cost" if version is None else f"sql_cost_v{version}"
    return fresh_schema(url, prefix=prefix, version=version)


@contextmanager
def _schema(url: str, messages: int, version: int | None = None) -> Iterator[str]:
    with _migrated(url, version) as schema:
        with connect(url, autocommit=True) as conn:
            # a partitioned table (delivered, attempts) takes storage parameters
            # on its partitions only; an unpartitioned one is its own leaf
            leaves = conn.execute(
                "SELECT CAST(t.relid AS text) FROM unnest(CAST(%s AS text[])) AS n(name),"
                " pg_partition_tree(CAST(n.name AS regclass)) AS t WHERE t.isleaf",
                ([f'"{schema}".{table}' for table in TABLES],),
            ).fetchall()
            for (leaf,) in leaves:
                conn.execute(f"ALTER TABLE {leaf} SET (autovacuum_enabled = false)")
        keys = [f"k-{i}" for i in range(messages)]
        seed_backlog(url, schema, targets=["http://127.0.0.1:9/hook"], keys=keys)
        with connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM ANALYZE {}.messages").format(sql.Identifier(schema)))
        yield schema


async def drain(
    url: str, postmaster: int, messages: int, batch: int, versions: list[int | None]
) -> dict[int | None, dict[str, float]]:
    """Claim and complete ``messages`` in statements of ``batch`` on a schema of
    each of ``versions`` (None: the current one), taking turns statement by
    statement; µs per message, by version."""
    with ExitStack() as stack:
        schemas = {v: stack.enter_context(_schema(url, messages + HELD, v)) for v in versions}
        stores = {
            v: Store(url, DispatcherConfig(schema=s, lease=600.0)) for v, s in schemas.items()
        }
        try:
            for store in stores.values():
                await store.open()
                # one backend each, opened before the clock: it reads the processes alive then
                await store.pool.resize(min_size=1, max_size=1)
                await store.work_remaining()
            cpu = ServerCpu(postmaster)
            spent = {
                v: dict.fromkeys(("claim", "complete", "renew", "vacuum"), 0) for v in versions
            }
            done = dict.fromkeys(versions, 0)
            # the destination the last claim found alone, as a dispatcher passes it
            alone: dict[int | None, str | None] = dict.fromkeys(versions)
            for v, store in stores.items():
                # a heartbeat of HELD leases, renewed RENEWALS times
                held = (await store.claim(OWNER, HELD)).messages
                before = cpu.read()
                for _ in range(RENEWALS):
                    await store.renew(OWNER, [(j.id, j.attempts) for j in held])
                spent[v]["renew"] = cpu.read() - before
                await store.complete(OWNER, _successes(held, datetime.now(UTC)))
            while True:
                drained = True
                for v, store in stores.items():
                    t0 = cpu.read()
                    jobs = (await store.claim(OWNER, batch, alone=alone[v])).messages
                    t1 = cpu.read()
                    if not jobs:
                        continue
                    destinations = {job.destination for job in jobs}
                    alone[v] = destinations.pop() if len(destinations) == 1 else None
                    drained = False
                    applied, _ = await store.complete(OWNER, _successes(jobs, datetime.now(UTC)))
                    t2 = cpu.read()
                    if len(applied) != len(jobs):
                        raise RuntimeError(f"{len(jobs) - len(applied)} outcomes fenced out")
                    spent[v]["claim"] += t1 - t0
                    spent[v]["complete"] += t2 - t1
                    done[v] += len(jobs)
                if drained:
                    break
        finally:
            for store in stores.values():
                await store.close()
        if set(done.values()) != {messages}:
            raise RuntimeError(f"drained {done} of {messages} each")
        with connect(url, autocommit=True) as conn:
            cpu = ServerCpu(postmaster)
            for v, schema in schemas.items():
                before = cpu.read()
                for table in ("messages", "delivered", "attempts"):
                    conn.execute(
                        sql.SQL("VACUUM {}.{}").format(
                            sql.Identifier(schema), sql.Identifier(table)
                        )
                    )
                spent[v]["vacuum"] = cpu.read() - before
    return {
        v: {
            "claim": t["claim"] / messages / 1000,
            "complete": t["complete"] / messages / 1000,
            "vacuum": t["vacuum"] / messages / 1000,
            "renew": t["renew"] / RENEWALS / HELD / 1000,
        }
        for v, t in spent.items()
    }


def _backend_cpu(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    pid = int(row[0]) if row else 0
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def planning(url: str, statement: Statement, params: dict[str, Any]) -> tuple[float, float]:
    """(backend CPU µs per EXPLAIN, median planner "Planning Time" µs) of one statement."""
    with connect(url, autocommit=True) as conn:
        text = "EXPLAIN (SUMMARY) " + psycopg.ClientCursor(conn).mogrify(statement.text, params)
        conn.execute(text)  # warm the catalog caches
        planned: list[float] = []
        before = _backend_cpu(conn)
        for _ in range(EXPLAINS):
            rows = conn.execute(text).fetchall()
            line = next(r[0] for r in rows if str(r[0]).startswith("Planning Time"))
            planned.append(float(line.split()[2]) * 1000)
        # subtract one trivial statement's cost per round: the protocol, not planning
        trivial = _backend_cpu(conn)
        for _ in range(EXPLAINS):
            conn.execute("EXPLAIN (SUMMARY) SELECT 1").fetchall()
        floor = _backend_cpu(conn) - trivial
        total = trivial - before
    return (total - floor) / EXPLAINS / 1000, statistics.median(planned)


def plans(url: str, batches: list[int]) -> list[tuple[str, float, float]]:
    results: list[tuple[str, float, float]] = []
    with _schema(url, 0) as schema:
        store = Store(url, DispatcherConfig(schema=schema))
        size = max(batches)
        now = datetime.now(UTC)
        fake = [_success(i, 1, now) for i in range(size)]
        retry = [replace(c, state="ready", outcome="retry", status=500, delay=5.0) for c in fake]
        cases = [
            ("claim", store.claim_statement(OWNER, size, capped=True)),
            ("claim_uncapped", store.claim_statement(OWNER, size, capped=False)),
            ("complete (retry)", store.complete_statement(OWNER, retry)),
            ("complete (success)", store.complete_statement(OWNER, fake)),
            (
                "renew",
                (
                    store.queries["renew"],
                    {
                        "owner": OWNER,
                        "lease_s": 30.0,
                        "ids": list(range(HELD)),
                        "attempts": [1] * HELD,
                    },
                ),
            ),
        ]
        for name, (statement, params) in cases:
            results.append((name, *planning(url, statement, params)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("-n", type=int, default=20000, help="messages per batch size")
    parser.add_argument("--batch", type=int, nargs="+", default=[10, 30, 100])
    parser.add_argument(
        "--against",
        type=int,
        metavar="VERSION",
        help="also drain a schema migrated only up to VERSION",
    )
    args = parser.parse_args()
    with database(args.database_url) as db:
        clock = postgres_clock(db.url)
        if clock is None:
            raise SystemExit("PostgreSQL must run on this host (its CPU is read from /proc)")
        print(f"PostgreSQL CPU µs per message, {args.n} messages, successes only")
        heads = ("claim", "complete", "vacuum", "total", "renew")
        print(f"{'batch':>5}" + "".join(f"  {h:>8}" for h in heads))
        versions: list[int | None] = [None]
        if args.against is not None:
            versions.append(args.against)
        for batch in args.batch:
            results = asyncio.run(drain(db.url, clock.pid, args.n, batch, versions))
            for version in versions:
                r = results[version]
                total = r["claim"] + r["complete"] + r["vacuum"]
                values = (r["claim"], r["complete"], r["vacuum"], total, r["renew"])
                mark = "" if version is None else f"  v{version:04d}"
                print(f"{batch:>5}" + "".join(f"  {v:>8.1f}" for v in values) + mark)
        print(f"\nparse + plan, EXPLAIN only, batch of {max(args.batch)} (µs per statement)")
        print(f"{'statement':<20}  {'backend CPU':>11}  {'planner':>8}")
        for name, cpu, planner in plans(db.url, args.batch):
            print(f"{name:<20}  {cpu:>11.0f}  {planner:>8.0f}")


if __name__ == "__main__":
    main()
