"""The floor the data model allows for the outbox's commit overhead, without Python.

Runs ``pgbench`` (4 clients, prepared statements) on scripts that play the
business transaction of ``outbox bench --scenario enqueue``: one INSERT into a
small table, then COMMIT (``plain``); the same plus one INSERT of the message's
payload into a table keyed only by a bigint identity (``floor``: the least any
durable outbox writes); and the same plus the real ``enqueue`` statement of
``sql/queries/enqueue.sql`` without and with its ``pg_notify`` (``enqueue``,
``enqueue-notify``). The scripts run interleaved (A B C A B C ...) for
``--rounds`` rounds of ``--seconds`` each, so load from other work on the
machine falls on all of them alike. Prints, per script, the transactions per
second, the ratio to ``plain``, the CPU per transaction of PostgreSQL (all its
processes, from ``/proc``) and of pgbench, and the WAL bytes per transaction
(exact, so it compares designs even on a noisy machine).

``--statements N`` writes N rows (N statements) per transaction instead of one,
so the commit is shared and each row's own cost stands out. ``--breakdown`` adds
scripts that each write only part of the outbox row, to show where PostgreSQL's
time goes: ``key-only`` (the ``message_keys`` row alone), ``message-only`` (the
``messages`` row alone, its id from the sequence) and ``notify-only`` (the
business insert plus ``pg_notify``). ``--against VERSION`` also runs the enqueue
scripts on a second schema migrated only up to that migration (named
``enqueue-vNNNN``), to measure a schema change against the schema before it;
the columns this tree's ``enqueue`` writes that the older ``messages`` table
lacks are added to it bare (no index, no rule), and what it reads of the
generations of keys (0033) empty, so the statement runs there and what differs
is the schema's indexes and rules.

Works on a throwaway embedded server (default) or ``--database-url``; either way
in fresh schemas dropped afterwards. Takes about ``rounds x scripts x seconds``.

    python benchmarks/enqueue_floor.py [--database-url URL] [--seconds 4] [--rounds 3]
                                       [--clients 4] [--statements 1] [--breakdown]
                                       [--against 3] [--pgbench PATH]
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import sql

from dispatchers.bench.env import (
    bench_queries,
    connect,
    database,
    fresh_schema,
    message_params,
    postgres_clock,
)
from outbox._queries import queries_for

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


@dataclass(frozen=True)
class Options:
    statements: int
    breakdown: bool


def row_statements(schema: str, breakdown: bool, suffix: str = "") -> dict[str, str]:
    """What each script writes after the business insert, by script name."""
    params = message_params(TARGET, "k", 1)
    nulls = {name for name, value in params.items() if value is None}
    queries = queries_for(schema)
    floor = _PARAM.sub(lambda m: ":" + m[1], bench_queries(schema)["floor_insert"])
    rows = {
        "floor": floor.replace(":payload", ":body") + ";\n",
        "enqueue": pgbench_sql(queries["enqueue"].text, nulls),
        "enqueue-notify": pgbench_sql(queries["enqueue_notify"].text, nulls),
    }
    if breakdown:
        rows["key-only"] = (
            f'INSERT INTO "{schema}".message_keys (target, idempotency_key, message_id)\n'
            f"VALUES (:target, :idempotency_key, nextval('\"{schema}\".messages_id_seq'))\n"
            "ON CONFLICT (target, idempotency_key) DO NOTHING RETURNING message_id;\n"
        )
        rows["message-only"] = pgbench_sql(message_insert(queries["enqueue"].text, schema), nulls)
    return {name + suffix: text for name, text in rows.items()}


def scripts(
    schema: str, options: Options, baseline: str | None = None, version: int = 0
) -> tuple[dict[str, str], dict[str, str]]:
    """The pgbench scripts by name, and the ``-D`` variables they use."""
    params = message_params(TARGET, "k", 1)
    variables = {
        # bytes in bytea's hex input form: a body, and the key's digest
        name: "\\x" + value.hex() if isinstance(value, bytes) else str(value)
        for name, value in params.items()
        if value is not None and name != "idempotency_key"
    }
    business = _PARAM.sub(lambda m: ":" + m[1], bench_queries(schema)["business_insert"]).replace(
        ":amount_cents", "1299"
    )
    n = options.statements
    keys = "".join(f"\\set idempotency_key{i} random(1, 1000000000000000)\n" for i in range(n))
    head = f"\\set customer_id random(0, 999)\n{keys}BEGIN;\n{business};\n"
    rows = row_statements(schema, options.breakdown)
    if baseline is not None:
        against = row_statements(baseline, False, f"-v{version:04d}")
        rows.update({k: v for k, v in against.items() if k.startswith("enqueue")})
    bodies = {"plain": ""}
    for name, row in rows.items():
        bodies[name] = "".join(
            row.replace(":idempotency_key", f":idempotency_key{i}") for i in range(n)
        )
    if options.breakdown:
        bodies["notify-only"] = f"SELECT pg_notify('{queries_for(schema).channel}', '');\n"
    return {name: head + body + "COMMIT;\n" for name, body in bodies.items()}, variables


DIGEST_VERSION = 7
"""The migration that gave ``message_keys`` the ``digest`` column, which the
enqueue statement writes."""


@contextmanager
def schema_at(url: str, version: int) -> Iterator[str]:
    """A fresh schema migrated only up to ``version``, dropped afterwards. A schema
    from before :data:`DIGEST_VERSION` gets that one column, so that the enqueue
    statement runs on it, and the comparison is of everything else."""
    with fresh_schema(url, prefix=f"outbox_floor_v{version}", version=version) as schema:
        if version < DIGEST_VERSION:
            with connect(url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN digest bytea").format(
                        sql.Identifier(schema, "message_keys")
                    )
                )
        yield schema


KEY_TAKEN_BEFORE = """
CREATE FUNCTION {function}(target text, idempotency_key text) RETURNS boolean
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, {path}, pg_temp
AS $$
BEGIN
    RETURN EXISTS (SELECT FROM {table} AS k
                   WHERE k.target = key_taken_before.target
                     AND k.idempotency_key = key_taken_before.idempotency_key);
END
$$
"""
"""``key_taken_before`` as migration 0034 makes it, for a schema from before it."""


def add_missing_columns(url: str, schema: str, baseline: str) -> None:
    """Add to ``baseline``'s messages table, bare, the columns of ``schema``'s that
    it lacks (``enqueue`` writes them); and, to a schema from before migration
    0033, what ``enqueue`` reads of the generations of keys: an empty previous
    table of keys (with its primary key) and ``_keys_moved``, always false; to
    one from before 0034, ``key_taken_before`` as 0034 makes it, which reads that
    table."""
    with connect(url, autocommit=True) as conn:
        if conn.execute(
            "SELECT to_regclass(quote_ident(%s) || '.message_keys_old') IS NULL", (baseline,)
        ).fetchone() == (True,):
            conn.execute(
                sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                    sql.Identifier(baseline, "message_keys_old"),
                    sql.Identifier(baseline, "message_keys"),
                )
            )
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}() RETURNS boolean LANGUAGE sql AS 'SELECT false'"
                ).format(sql.Identifier(baseline, "_keys_moved"))
            )
        if conn.execute(
            "SELECT to_regproc(quote_ident(%s) || '.key_taken_before') IS NULL", (baseline,)
        ).fetchone() == (True,):
            conn.execute(
                sql.SQL(KEY_TAKEN_BEFORE).format(
                    function=sql.Identifier(baseline, "key_taken_before"),
                    table=sql.Identifier(baseline, "message_keys_old"),
                    path=sql.Identifier(baseline),
                )
            )
        missing = conn.execute(
            "SELECT c.column_name, format_type(a.atttypid, a.atttypmod)"
            " FROM information_schema.columns AS c"
            " JOIN pg_attribute AS a ON a.attrelid = to_regclass(quote_ident(%(schema)s)"
            "     || '.messages') AND a.attname = c.column_name"
            " WHERE c.table_schema = %(schema)s AND c.table_name = 'messages'"
            "   AND c.column_name NOT IN (SELECT column_name FROM information_schema.columns"
            "       WHERE table_schema = %(baseline)s AND table_name = 'messages')",
            {"schema": schema, "baseline": baseline},
        ).fetchall()
        for column, type_name in missing:
            conn.execute(
                sql.SQL("ALTER TABLE {}.messages ADD COLUMN {} {}").format(
                    sql.Identifier(baseline), sql.Identifier(column), sql.SQL(type_name)
                )
            )


def prepare_tables(url: str, schema: str) -> None:
    with connect(url, autocommit=True) as conn:
        conn.execute(bench_queries(schema)["business_table"])
        conn.execute(bench_queries(schema)["floor_table"])


def wal_position(url: str) -> Any:
    with connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    return row[0] if row else None


def wal_since(url: str, start: Any) -> float:
    with connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (start,)).fetchone()
    return float(row[0]) if row else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("--seconds", type=float, default=4.0, help="per script and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument(
        "--statements", type=int, default=1, help="rows (statements) per transaction"
    )
    parser.add_argument("--breakdown", action="store_true", help="add partial-row scripts")
    parser.add_argument(
        "--against",
        type=int,
        metavar="VERSION",
        help="also run the enqueue scripts on a schema migrated only up to VERSION",
    )
    parser.add_argument("--pgbench", help="the pgbench binary (default: found)")
    args = parser.parse_args()
    pgbench = find_pgbench(args.pgbench)
    seconds = max(1, round(args.seconds))
    options = Options(max(1, args.statements), args.breakdown)
    with ExitStack() as stack:
        db = stack.enter_context(database(args.database_url))
        schema = stack.enter_context(fresh_schema(db.url, prefix="outbox_floor"))
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="outbox-floor-"))
        prepare_tables(db.url, schema)
        baseline = None
        if args.against is not None:
            baseline = stack.enter_context(schema_at(db.url, args.against))
            add_missing_columns(db.url, schema, baseline)
            prepare_tables(db.url, baseline)
        clock = postgres_clock(db.url)
        texts, variables = scripts(schema, options, baseline, args.against or 0)
        defines = [f"--define={name}={value}" for name, value in variables.items()]
        paths = {}
        for name, text in texts.items():
            paths[name] = Path(tmp, f"{name}.sql")
            paths[name].write_text(text)
        # transactions, pg cpu, pgbench cpu, WAL bytes
        totals = {name: [0, 0.0, 0.0, 0.0] for name in texts}
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
                wal0 = wal_position(db.url)
                pg0 = clock.read() if clock else None
                child0 = os.times()
                done = subprocess.run(
                    command, capture_output=True, text=True, timeout=seconds + 60, check=False
                )
                child1 = os.times()
                pg1 = clock.read() if clock else None
                wal = wal_since(db.url, wal0)
                found = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
                if done.returncode != 0 or not found:
                    raise SystemExit(f"pgbench failed on {name}:\n{done.stdout}\n{done.stderr}")
                total = totals[name]
                total[0] += int(found[1])
                total[1] += (pg1 - pg0) if pg0 is not None and pg1 is not None else float("nan")
                total[2] += (child1.children_user + child1.children_system) - (
                    child0.children_user + child0.children_system
                )
                total[3] += wal
    elapsed = args.rounds * seconds
    plain = totals["plain"][0] / elapsed
    print(
        f"{args.clients} clients, {args.rounds} x {seconds} s per script, pgbench -M prepared, "
        f"{options.statements} row(s) per transaction"
    )
    print(
        f"{'script':<20} {'tx/s':>8} {'ratio':>6} {'pg us/tx':>9} {'pgbench us/tx':>14} "
        f"{'WAL B/tx':>9}"
    )
    for name, (count, pg_cpu, bench_cpu, wal) in totals.items():
        rate = count / elapsed
        print(
            f"{name:<20} {rate:>8.0f} {rate / plain:>6.2f} "
            f"{pg_cpu / count * 1e6:>9.0f} {bench_cpu / count * 1e6:>14.0f} {wal / count:>9.0f}"
        )


if __name__ == "__main__":
    main()
