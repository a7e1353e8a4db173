"""What the partitioned history (migrations 0030-0032) and the generations of keys
(0033) buy at scale: ``--rows``
delivered messages (10,000,000 by default), each with its attempt and its key,
spread over ``--days`` days of partitions (7), then

(a) the removal of the oldest day: dropping its two partitions (delivered and
    attempts, as the dispatchers' maintenance does) against deleting the same
    rows from an unpartitioned copy of that day in batches of 5,000 (as
    retention did), with the VACUUM that a delete leaves to do; each timed, with
    the WAL it wrote (the WAL insert position before and after). Then the
    idempotency keys: the day's deleted in batches of 5,000 (as retention did
    before migration 0033), against the turn of their generation (0033): the
    first turn makes the table of every key the previous generation, the second
    (after (b)) drops it whole;
(b) the throughput of enqueues (``--enqueues``, committed every 100; each key
    looked up in a previous generation that holds every key loaded) and of a
    drain (``--messages`` messages, our dispatcher in its own process, no HTTP:
    the transport answers) in the schema with that history against an empty
    one, the two in turn for ``--rounds`` rounds (2).

    python benchmarks/history_scale.py [--database-url URL] [--rows 10000000]
        [--days 7] [--messages 20000] [--enqueues 5000] [--rounds 2]

Without ``--database-url``, a throwaway embedded server. Ten million rows take
about 2 GB of disk and, on 2 cores, some minutes to load.
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from dispatchers.bench import Settings
from dispatchers.bench.context import Bench
from dispatchers.bench.drain import drain_in
from dispatchers.bench.env import database, fresh_schema
from outbox import Outbox

TARGET = "http://127.0.0.1:9/noop"
CHUNK = 500_000
BATCH = 5_000

LOAD = """
WITH rows AS (
    SELECT g, %(start)s + (g - 1) * %(spacing)s * interval '1 second' AS at
    FROM generate_series(CAST(%(first)s AS bigint), %(last)s) AS g
), keys AS (
    INSERT INTO {s}.message_keys (target, idempotency_key, message_id, created_at)
    SELECT %(target)s, 'history-' || g, g, at FROM rows
), history AS (
    INSERT INTO {s}.delivered (id, idempotency_key, target, url, method, headers, body,
                               content_type, attempts, max_attempts, last_status,
                               created_at, completed_at)
    SELECT g, 'history-' || g, %(target)s, %(target)s, 'POST', '{{}}',
           convert_to('{{"order_id": ' || g || ', "customer": "ada", "total": 4200}}', 'UTF8'),
           'application/json', 1, 12, 200, at - interval '20 ms', at
    FROM rows
)
INSERT INTO {s}.attempts (message_id, attempt, owner, started_at, duration_ms, status, outcome)
SELECT g, 1, 'history', at - interval '10 ms', 5, 200, 'delivered' FROM rows
"""


def wal(conn: psycopg.Connection[Any]) -> int:
    # the insert position: the write position lags behind what sits in WAL buffers
    row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()
    assert row is not None
    return int(row[0])


def measured(conn: psycopg.Connection[Any], work: Any) -> tuple[float, int]:
    """Seconds and WAL bytes of ``work(conn)`` (which commits what it does)."""
    w0, t0 = wal(conn), time.perf_counter()
    work(conn)
    return time.perf_counter() - t0, wal(conn) - w0


def midnight() -> datetime:
    return datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def load(url: str, schema: str, rows: int, days: int) -> datetime:
    """``rows`` history rows spread evenly over the ``days`` days before today, in
    partitions of a day; returns the start of the oldest day."""
    start = midnight() - timedelta(days=days)
    s = sql.Identifier(schema)
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(days):
            lower = start + timedelta(days=n)
            for parent in ("delivered", "attempts"):
                conn.execute(
                    sql.SQL("SELECT {}._history_partition_add(%s, %s, %s)").format(s),
                    (parent, lower, lower + timedelta(days=1)),
                )
        spacing = days * 86400.0 / rows
        t0 = time.perf_counter()
        for first in range(1, rows + 1, CHUNK):
            last = min(rows, first + CHUNK - 1)
            params = {
                "start": start,
                "spacing": spacing,
                "first": first,
                "last": last,
                "target": TARGET,
            }
            conn.execute(sql.SQL(LOAD).format(s=s), params)
            print(f"  loaded {last:,} rows ({time.perf_counter() - t0:.0f} s)", flush=True)
        conn.execute(sql.SQL("SELECT setval(%s, %s)"), (f"{schema}.messages_id_seq", rows + 1))
        conn.execute(
            sql.SQL("VACUUM ANALYZE {}.delivered, {}.attempts, {}.message_keys").format(s, s, s)
        )
    return start


def copy_day(url: str, schema: str, plain: str, lower: datetime) -> int:
    """The oldest day's rows, into unpartitioned tables of schema ``plain`` shaped
    as before migration 0030 (primary keys and the same indexes)."""
    s, p = sql.Identifier(schema), sql.Identifier(plain)
    day = {"lower": lower, "upper": lower + timedelta(days=1)}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(p))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {p}.delivered (LIKE {s}.delivered INCLUDING INDEXES,"
                " PRIMARY KEY (id))"
            ).format(p=p, s=s)
        )
        conn.execute(
            sql.SQL(
                "CREATE TABLE {p}.attempts (LIKE {s}.attempts INCLUDING INDEXES,"
                " PRIMARY KEY (message_id, attempt))"
            ).format(p=p, s=s)
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {p}.delivered SELECT * FROM {s}.delivered"
                " WHERE completed_at >= %(lower)s AND completed_at < %(upper)s"
            ).format(p=p, s=s),
            day,
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {p}.attempts SELECT * FROM {s}.attempts"
                " WHERE started_at >= %(lower)s AND started_at < %(upper)s"
            ).format(p=p, s=s),
            day,
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {p}.delivered, {p}.attempts").format(p=p))
        conn.execute("CHECKPOINT")  # the next writes' full-page images fall on both alike
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.delivered").format(p)).fetchone()
    assert row is not None
    return int(row[0])


def delete_in_batches(plain: str) -> Any:
    p = sql.Identifier(plain)
    statement = sql.SQL(
        "WITH old AS (SELECT id FROM {p}.delivered ORDER BY completed_at LIMIT %(limit)s),"
        " removed AS (DELETE FROM {p}.delivered AS d USING old WHERE d.id = old.id"
        "             RETURNING d.id)"
        " , gone AS (DELETE FROM {p}.attempts AS a USING removed"
        "            WHERE a.message_id = removed.id)"
        " SELECT count(*) FROM removed"
    ).format(p=p)

    def work(conn: psycopg.Connection[Any]) -> None:
        while True:
            row = conn.execute(statement, {"limit": BATCH}).fetchone()
            if row is None or row[0] < BATCH:
                return

    return work


def vacuum(plain: str) -> Any:
    def work(conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("VACUUM {p}.delivered, {p}.attempts").format(p=sql.Identifier(plain)))

    return work


def drop_day(schema: str, lower: datetime) -> Any:
    name = lower.strftime("%Y%m%d")

    def work(conn: psycopg.Connection[Any]) -> None:
        for parent in ("delivered", "attempts"):
            row = conn.execute(
                # the shortest retention history_drop takes (0034)
                sql.SQL("SELECT {}.history_drop(%s, interval '1 hour')").format(
                    sql.Identifier(schema)
                ),
                (f"{parent}_p{name}",),
            ).fetchone()
            assert row == (True,), (parent, name, row)

    return work


KEYS_DELETE = """
WITH batch AS (
    SELECT d.id, d.target, d.idempotency_key
    FROM {s}.delivered AS d
    WHERE d.completed_at >= %(lower)s AND d.completed_at < %(upper)s AND d.id > %(after)s
    ORDER BY d.id
    LIMIT %(limit)s
), gone AS (
    DELETE FROM {s}.message_keys AS k
    USING batch
    WHERE k.target = batch.target AND k.idempotency_key = batch.idempotency_key
      AND k.message_id = batch.id
)
SELECT count(*), max(id) FROM batch
"""


def remove_keys(schema: str, lower: datetime) -> Any:
    """The day's keys deleted in batches, as retention did before migration 0033."""
    statement = sql.SQL(KEYS_DELETE).format(s=sql.Identifier(schema))

    def work(conn: psycopg.Connection[Any]) -> None:
        after = 0
        while True:
            params = {
                "lower": lower,
                "upper": lower + timedelta(days=1),
                "after": after,
                "limit": BATCH,
            }
            rows, last = conn.execute(statement, params).fetchone()  # type: ignore[misc]
            if last is not None:
                after = last
            if rows < BATCH:
                return

    return work


def keys_in(conn: psycopg.Connection[Any], schema: str, table: str) -> int:
    query = sql.SQL("SELECT count(*) FROM {}.{}").format(
        sql.Identifier(schema), sql.Identifier(table)
    )
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def turn_keys(schema: str) -> Any:
    """One turn of the generation of keys (migration 0033), made due first: its
    last carry set back past the retention period."""
    s = sql.Identifier(schema)

    def work(conn: psycopg.Connection[Any]) -> None:
        row = conn.execute(
            sql.SQL("SELECT {}.key_generation_turn(interval '7 days')").format(s)
        ).fetchone()
        assert row is not None and row[0] is not None, row
        while conn.execute(
            sql.SQL("SELECT {}.key_generation_carry(5000)").format(s)
        ).fetchone() == (5000,):
            pass

    return work


def due(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(
        sql.SQL("UPDATE {}.key_generation SET carried_at = now() - interval '8 days'").format(
            sql.Identifier(schema)
        )
    )


def enqueues_per_s(url: str, schema: str, count: int, round_: int) -> float:
    """Enqueue ``count`` messages of new keys; return how many a second. The
    messages are then removed (their keys stay), so that the next drain finds
    only its own."""
    box = Outbox(schema=schema, notify=False)
    with psycopg.connect(url) as conn:
        t0 = time.perf_counter()
        for i in range(count):
            box.enqueue(
                conn, url=TARGET, idempotency_key=f"scale-{schema}-{round_}-{i}", json={"i": i}
            )
            if (i + 1) % 100 == 0:
                conn.commit()
        conn.commit()
        rate = count / (time.perf_counter() - t0)
        conn.execute(
            sql.SQL("DELETE FROM {}.messages WHERE url = %s").format(sql.Identifier(schema)),
            (TARGET,),
        )
        conn.commit()
        return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="default: a throwaway embedded server")
    parser.add_argument("--rows", type=int, default=10_000_000, help="default 10000000")
    parser.add_argument("--days", type=int, default=7, help="default 7")
    parser.add_argument("--messages", type=int, default=20_000, help="drained, default 20000")
    parser.add_argument("--enqueues", type=int, default=5_000, help="default 5000")
    parser.add_argument(
        "--rounds", type=int, default=2, help="of (b), the two schemas in turn, default 2"
    )
    args = parser.parse_args()

    with database(args.database_url) as db, fresh_schema(db.url, "history_big") as big:
        print(f"loading {args.rows:,} delivered messages over {args.days} days", flush=True)
        t0 = time.perf_counter()
        oldest = load(db.url, big, args.rows, args.days)
        print(f"  loaded in {time.perf_counter() - t0:.0f} s", flush=True)
        plain = big + "_plain"
        try:
            day_rows = copy_day(db.url, big, plain, oldest)
            with psycopg.connect(db.url, autocommit=True) as conn:
                figures = [
                    (
                        "DELETE the day, unpartitioned, 5,000 a batch",
                        measured(conn, delete_in_batches(plain)),
                    ),
                    ("  and the VACUUM it leaves", measured(conn, vacuum(plain))),
                ]
                conn.execute("CHECKPOINT")
                figures.append(
                    (
                        "the day's keys, DELETE, 5,000 a batch",
                        measured(conn, remove_keys(big, oldest)),
                    )
                )
                figures.append(
                    ("drop the day's two partitions", measured(conn, drop_day(big, oldest)))
                )
                due(conn, big)
                figures.append(("turn: every key made previous", measured(conn, turn_keys(big))))
        finally:
            with psycopg.connect(db.url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(plain))
                )

        print(f"\n(a) removing one day of history: {day_rows:,} delivered rows and attempts")
        print(f"{'operation':<50} {'seconds':>9} {'WAL MB':>9}")
        for name, (seconds, wal_bytes) in figures:
            print(f"{name:<50} {seconds:>9.3f} {wal_bytes / 1e6:>9.2f}", flush=True)

        bench = Bench(
            db, Settings(messages=args.messages, drain_timeout=600.0), progress=lambda _: None
        )
        results = []
        try:
            with fresh_schema(db.url, "history_empty") as empty:
                for round_ in range(args.rounds):
                    for label, schema in (("empty history", empty), ("large history", big)):
                        run = drain_in(
                            bench, schema, design="outbox", http=False, messages=args.messages
                        )
                        enq = enqueues_per_s(db.url, schema, args.enqueues, round_)
                        results.append((label, enq, run.msgs_per_s, run.failures))
        finally:
            bench.close()
        # the previous generation holds every key loaded: the next turn drops it
        with psycopg.connect(db.url, autocommit=True) as conn:
            previous = keys_in(conn, big, "message_keys_old")
            due(conn, big)
            seconds, wal_bytes = measured(conn, turn_keys(big))
        name = f"turn: {previous:,} keys dropped whole"
        print(f"{name:<50} {seconds:>9.3f} {wal_bytes / 1e6:>9.2f}")
        history = args.rows - day_rows
        print(f"\n(b) throughput, history of {history:,} delivered rows against none")
        print(f"{'schema':<16} {'enqueues/s':>11} {'drained msgs/s':>15}")
        for label, enq, drained, failures in results:
            print(
                f"{label:<16} {enq:>11.0f} {drained or 0:>15.0f}"
                + (f"  ({'; '.join(failures)})" if failures else "")
            )


if __name__ == "__main__":
    main()
