"""The floor the data model allows for the outbox's commit overhead, without Python.

Runs ``pgbench`` (4 clients, prepared statements) on scripts that play the
business transaction of ``outbox bench --scenario enqueue``: one INSERT into a
small table, then COMMIT (``plain``), and the same plus the real ``enqueue``
statement of ``outbox/queries.sql`` without and with its ``pg_notify``
(``enqueue``, ``enqueue-notify``). The scripts run interleaved (A B C A B C ...)
for ``--rounds`` rounds of ``--seconds`` each, so load from other work on the
machine falls on all of them alike. Prints, per script, the transactions per
second, the ratio to ``plain``, and the CPU per transaction of PostgreSQL (all
its processes, from ``/proc``) and of pgbench.

``--breakdown`` adds scripts that each write only part of the outbox row, to show
where PostgreSQL's time goes: ``key-only`` (the ``message_keys`` row alone),
``message-only`` (the ``messages`` row alone, its id from the sequence) and
``notify-only`` (the business insert plus ``pg_notify``).

Works on a throwaway embedded server (default) or ``--database-url``; either way
in a fresh schema dropped afterwards. Takes about ``rounds x scripts x seconds``.

    python benchmarks/enqueue_floor.py [--database-url URL] [--seconds 4] [--rounds 3]
                                       [--clients 4] [--breakdown] [--pgbench PATH]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from dispatchers.bench.env import (
    bench_queries,
    connect,
    database,
    fresh_schema,
    message_params,
    postgres_clock,
)
from outbox.queries import queries_for

TARGET = "http://127.0.0.1:9/orders"
_PARAM = re.compile(r"%\((\w+)\)s")


def find_pgbench(given: str | None) -> str:
    """``given``, else pgbench on PATH, else the newest in /usr/lib/postgresql."""
    found = given or shutil.which("pgbench")
    if not found:
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))
        found = candidates[-1] if candidates else None
    if not found:
        raise SystemExit("pgbench not found: install the PostgreSQL client or give --pgbench")
    return found


def pgbench_sql(statement: str, nulls: set[str]) -> str:
    """``statement`` as a pgbench command: ``%(name)s`` becomes ``:name`` (or NULL)."""
    lines = [line for line in statement.splitlines() if not line.lstrip().startswith("--")]
    text = "\n".join(lines)
    return _PARAM.sub(lambda m: "NULL" if m[1] in nulls else f":{m[1]}", text) + ";\n"


def message_insert(enqueue: str, schema: str) -> str:
    """The ``messages`` INSERT of the ``enqueue`` statement alone, its id from the
    sequence instead of from the ``message_keys`` row."""
    found = re.search(r"new_message AS \((.*)\)\s*SELECT", enqueue, re.DOTALL)
    if not found or "FROM new_key" not in found[1]:
        raise SystemExit("--breakdown: the enqueue statement no longer has a new_message CTE")
    return (
        found[1]
        .replace("FROM new_key", "")
        .replace("new_key.message_id", f"nextval('\"{schema}\".messages_id_seq')")
    )


def scripts(schema: str, breakdown: bool) -> tuple[dict[str, str], dict[str, str]]:
    """The pgbench scripts by name, and the ``-D`` variables they use."""
    params = message_params(TARGET, "k", 1)
    nulls = {name for name, value in params.items() if value is None}
    variables = {
        name: value.decode() if isinstance(value, bytes) else str(value)
        for name, value in params.items()
        if value is not None and name != "idempotency_key"
    }
    queries = queries_for(schema)
    business = _PARAM.sub(lambda m: ":" + m[1], bench_queries(schema)["business_insert"]).replace(
        ":amount_cents", "1299"
    )
    head = (
        "\\set customer_id random(0, 999)\n"
        "\\set idempotency_key random(1, 1000000000000000)\n"
        f"BEGIN;\n{business};\n"
    )
    bodies = {
        "plain": "",
        "enqueue": pgbench_sql(queries["enqueue"].text, nulls),
        "enqueue-notify": pgbench_sql(queries["enqueue_notify"].text, nulls),
    }
    if breakdown:
        key_only = (
            f'INSERT INTO "{schema}".message_keys (target, idempotency_key, message_id)\n'
            f"VALUES (:target, :idempotency_key, nextval('\"{schema}\".messages_id_seq'))\n"
            "ON CONFLICT (target, idempotency_key) DO NOTHING RETURNING message_id;\n"
        )
        message_only = pgbench_sql(message_insert(queries["enqueue"].text, schema), nulls)
        bodies["key-only"] = key_only
        bodies["message-only"] = message_only
        bodies["notify-only"] = f"SELECT pg_notify('{queries.channel}', '');\n"
    return {name: head + body + "COMMIT;\n" for name, body in bodies.items()}, variables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("--seconds", type=float, default=4.0, help="per script and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--breakdown", action="store_true", help="add partial-row scripts")
    parser.add_argument("--pgbench", help="the pgbench binary (default: found)")
    args = parser.parse_args()
    pgbench = find_pgbench(args.pgbench)
    seconds = max(1, round(args.seconds))
    with (
        database(args.database_url) as db,
        fresh_schema(db.url, prefix="outbox_floor") as schema,
        tempfile.TemporaryDirectory(prefix="outbox-floor-") as tmp,
    ):
        with connect(db.url, autocommit=True) as conn:
            conn.execute(bench_queries(schema)["business_table"])
        clock = postgres_clock(db.url)
        texts, variables = scripts(schema, args.breakdown)
        defines = [f"--define={name}={value}" for name, value in variables.items()]
        paths = {}
        for name, text in texts.items():
            paths[name] = Path(tmp, f"{name}.sql")
            paths[name].write_text(text)
        totals = {name: [0, 0.0, 0.0] for name in texts}  # transactions, pg cpu, pgbench cpu
        for _ in range(args.rounds):
            for name, path in paths.items():
                command = [
                    pgbench,
                    "-n",
                    "-M",
                    "prepared",
                    f"-c{args.clients}",
                    f"-j{args.clients}",
                    f"-T{seconds}",
                    "-f",
                    str(path),
                    *defines,
                    db.url,
                ]
                pg0 = clock.read() if clock else None
                child0 = os.times()
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=seconds + 60, check=False
                )
                child1 = os.times()
                pg1 = clock.read() if clock else None
                found = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
                if done.returncode != 0 or not found:
                    raise SystemExit(f"pgbench failed on {name}:\n{done.stdout}\n{done.stderr}")
                total = totals[name]
                total[0] += int(found[1])
                total[1] += (pg1 - pg0) if pg0 is not None and pg1 is not None else float("nan")
                total[2] += (child1.children_user + child1.children_system) - (
                    child0.children_user + child0.children_system
                )
    elapsed = args.rounds * seconds
    plain = totals["plain"][0] / elapsed
    print(f"{args.clients} clients, {args.rounds} x {seconds} s per script, pgbench -M prepared")
    print(f"{'script':<15} {'tx/s':>8} {'ratio':>6} {'pg us/tx':>9} {'pgbench us/tx':>14}")
    for name, (count, pg_cpu, bench_cpu) in totals.items():
        rate = count / elapsed
        print(
            f"{name:<15} {rate:>8.0f} {rate / plain:>6.2f} "
            f"{pg_cpu / count * 1e6:>9.0f} {bench_cpu / count * 1e6:>14.0f}"
        )


if __name__ == "__main__":
    main()
