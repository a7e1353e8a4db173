"""What the alert triggers of migration 0028 cost the statements they watch.

Seeds ``-n`` ready messages in a fresh schema, then times, per row, with the
trigger ``messages_alert_dead`` enabled and disabled in turns (``--rounds`` of
each, the median and the least printed):

- ``claim-like``: an update of every row's state to running and back, as a
  claim and a retry write it (the trigger's ``WHEN`` clause, and nothing more);
- ``dead, no taker``: every row made dead while no endpoint takes alerts (one
  probe of the index of endpoints that take alerts per row, nothing written);
- ``dead, one taker``: the same with one endpoint subscribed to ``outbox.*``
  (one alert written per row: its message, key and event).

Times are the client's wall clock around each statement, divided by the rows it
changed: on a quiet machine they are the server's work.

    python benchmarks/alert_triggers_cost.py [--database-url URL] [-n 5000] [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from dispatchers.bench.env import connect, database, fresh_schema

SEED = """
INSERT INTO {s}.messages (id, idempotency_key, target, destination, url, method, headers,
                          body, content_type, state, max_attempts)
SELECT i, 'k' || i, 'https://bench.example/', 'https://bench.example:443',
       'https://bench.example/', 'POST', '{{}}', '{{}}', 'application/json', 'ready', 5
FROM generate_series(1, %(n)s) AS i
"""
CLAIM_LIKE = (
    "UPDATE {s}.messages SET state = 'running', lease_owner = 'bench',"
    " lease_until = now() + interval '30 seconds', attempts = attempts + 1",
    "UPDATE {s}.messages SET state = 'ready', lease_owner = NULL, lease_until = NULL",
)
DEAD = (
    "UPDATE {s}.messages SET state = 'dead', completed_at = now(), last_error = 'bench'",
    "UPDATE {s}.messages SET state = 'ready', completed_at = NULL",
)
TOGGLE = "ALTER TABLE {s}.messages {how} TRIGGER messages_alert_dead"


def timed(
    conn: psycopg.Connection[tuple[object, ...]],
    schema: str,
    pair: tuple[str, ...],
    n: int,
    rounds: int,
    cleanup: Callable[[], None] = lambda: None,
) -> dict[bool, list[float]]:
    """µs per row of the first statement of ``pair`` (the second undoes it), the
    trigger on and off in turns."""
    s = sql.Identifier(schema)
    spent: dict[bool, list[float]] = {True: [], False: []}
    for r in range(2 * rounds):
        on = r % 2 == 0
        conn.execute(sql.SQL(TOGGLE).format(s=s, how=sql.SQL("ENABLE" if on else "DISABLE")))
        conn.execute(sql.SQL("VACUUM {s}.messages").format(s=s))
        start = time.perf_counter()
        conn.execute(sql.SQL(pair[0]).format(s=s))
        spent[on].append((time.perf_counter() - start) / n * 1e6)
        conn.execute(sql.SQL(pair[1]).format(s=s))
        cleanup()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("-n", type=int, default=5000, help="messages updated per statement")
    parser.add_argument("--rounds", type=int, default=10, help="statements timed each way")
    args = parser.parse_args()
    with database(args.database_url) as db, fresh_schema(db.url) as schema:
        s = sql.Identifier(schema)
        with connect(db.url, autocommit=True) as conn:
            conn.execute("SET statement_timeout = 0")
            conn.execute(sql.SQL(SEED).format(s=s), {"n": args.n})
            sequence = sql.Identifier(schema, "messages_id_seq")
            conn.execute(
                sql.SQL("SELECT setval({}, %(n)s)").format(sql.Literal(sequence.as_string(conn))),
                {"n": args.n},
            )
            conn.execute(sql.SQL("VACUUM ANALYZE {s}.messages").format(s=s))

            def forget_alerts() -> None:
                for table in ("messages", "message_keys", "events"):
                    conn.execute(
                        sql.SQL("DELETE FROM {s}.{t} WHERE {c} LIKE 'outbox.%%'").format(
                            s=s,
                            t=sql.Identifier(table),
                            c=sql.Identifier(
                                "event_type" if table != "message_keys" else "idempotency_key"
                            ),
                        )
                    )

            rows = [
                ("claim-like", timed(conn, schema, CLAIM_LIKE, args.n, args.rounds)),
                ("dead, no taker", timed(conn, schema, DEAD, args.n, args.rounds)),
            ]
            conn.execute(
                sql.SQL(
                    "INSERT INTO {s}.endpoints (url, event_types)"
                    " VALUES ('https://pager.bench.example/', '{{outbox.*}}')"
                ).format(s=s)
            )
            rows.append(
                ("dead, one taker", timed(conn, schema, DEAD, args.n, args.rounds, forget_alerts))
            )
    print(f"µs per row, {args.n} rows per statement, {args.rounds} statements each way")
    print(f"{'statement':<18}{'trigger on':>12}{'off':>10}{'least on':>10}{'off':>10}")
    for name, spent in rows:
        on, off = spent[True], spent[False]
        print(
            f"{name:<18}{statistics.median(on):>12.2f}{statistics.median(off):>10.2f}"
            f"{min(on):>10.2f}{min(off):>10.2f}"
        )


if __name__ == "__main__":
    main()
