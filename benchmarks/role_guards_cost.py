"""What the guards of migration 0034 cost a producer: enqueue and publish timed on
a schema at 0033 and one at 0034, in turns, in one run.

0034 adds to ``messages`` a CHECK (an endpoint's message names no URL, and its
destination is the endpoint's) and a BEFORE INSERT trigger whose ``WHEN`` clause
is false for every message the library writes. Each round writes ``-n`` messages
to each schema, one transaction each (a business-sized insert, the enqueue or the
publish, the commit), alternating the schemas round by round; the median and the
least of the rounds' µs per transaction are printed. Then the guards' own cost
per row, apart from the client and the commit: ``--rows`` plain and endpoint
messages inserted by one statement into each schema in turns (µs per row).

    python benchmarks/role_guards_cost.py [--database-url URL] [-n 500] [--rounds 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from psycopg import sql

from dispatchers.bench.env import connect, database, fresh_schema, run_id
from outbox import Outbox
from outbox.endpoints import Endpoints


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("-n", type=int, default=500, help="transactions per round and schema")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each schema")
    parser.add_argument("--rows", type=int, default=50_000, help="rows per INSERT ... SELECT")
    args = parser.parse_args()
    with database(args.database_url) as db, ExitStack() as stack:
        schemas = {
            "0033": stack.enter_context(fresh_schema(db.url, version=33)),
            "0034": stack.enter_context(fresh_schema(db.url)),
        }
        conn = stack.enter_context(connect(db.url))
        for schema in schemas.values():
            Endpoints(schema=schema).add(conn, url="https://bench.example/hooks")
            conn.execute(sql.SQL("CREATE TABLE {}.orders (id text)").format(sql.Identifier(schema)))
        conn.commit()
        tag = run_id()

        def enqueue(schema: str, i: int) -> None:
            Outbox(schema=schema).enqueue(
                conn,
                url="https://bench.example/orders",
                idempotency_key=f"{tag}-e{i}",
                json={"n": i},
            )

        def publish(schema: str, i: int) -> None:
            Outbox(schema=schema).publish(
                conn, "order.paid", {"n": i}, idempotency_key=f"{tag}-p{i}"
            )

        results: dict[str, dict[str, list[float]]] = {}
        for name, write in (("enqueue", enqueue), ("publish", publish)):
            spent: dict[str, list[float]] = {version: [] for version in schemas}
            done = 0
            for r in range(2 * args.rounds):
                version = list(schemas)[r % 2]
                spent[version].append(timed(conn, schemas[version], write, done, args.n))
                done += args.n
            results[name] = spent
        conn.execute("SET statement_timeout = 0")
        for name, endpoint in (("rows, plain", False), ("rows, endpoint", True)):
            spent = {version: [] for version in schemas}
            for r in range(2 * args.rounds):
                version = list(schemas)[r % 2]
                spent[version].append(inserted(conn, schemas[version], endpoint, args.rows))
            results[name] = spent
    print(
        f"µs per transaction ({args.n} a round), per row ({args.rows} a statement), "
        f"{args.rounds} rounds each"
    )
    print(f"{'producer':<16}{'0033':>10}{'0034':>10}{'ratio':>8}{'least 0033':>12}{'0034':>10}")
    for name, spent in results.items():
        before, after = statistics.median(spent["0033"]), statistics.median(spent["0034"])
        print(
            f"{name:<16}{before:>10.1f}{after:>10.1f}{after / before:>8.3f}"
            f"{min(spent['0033']):>12.1f}{min(spent['0034']):>10.1f}"
        )


ROWS = """
INSERT INTO {s}.messages (id, idempotency_key, target, destination, endpoint_id, url, method,
                          headers, body, content_type, state, max_attempts)
SELECT nextval({seq}), 'g' || i, t.target, t.target, t.endpoint_id, t.url, 'POST', '{{}}',
       '{{}}', 'application/json', 'ready', 5
FROM generate_series(1, %(rows)s) AS i,
     (SELECT CASE WHEN %(endpoint)s THEN 'endpoint:' || e.id ELSE 'https://bench.example' END
                 AS target,
             CASE WHEN %(endpoint)s THEN e.id END AS endpoint_id,
             CASE WHEN %(endpoint)s THEN NULL ELSE 'https://bench.example/rows' END AS url
      FROM {s}.endpoints AS e LIMIT 1) AS t
"""


def inserted(conn: Any, schema: str, endpoint: bool, rows: int) -> float:
    """µs per row of one statement inserting ``rows`` messages (then removed)."""
    s = sql.Identifier(schema)
    seq = sql.Literal(f"{schema}.messages_id_seq")
    start = time.perf_counter()
    conn.execute(sql.SQL(ROWS).format(s=s, seq=seq), {"rows": rows, "endpoint": endpoint})
    spent = (time.perf_counter() - start) / rows * 1e6
    conn.execute(sql.SQL("DELETE FROM {s}.messages WHERE idempotency_key LIKE 'g%%'").format(s=s))
    conn.commit()
    return spent


def timed(conn: Any, schema: str, write: Callable[[str, int], None], first: int, n: int) -> float:
    """µs per transaction of ``n`` business transactions that each call ``write``."""
    insert = sql.SQL("INSERT INTO {}.orders VALUES (%s)").format(sql.Identifier(schema))
    start = time.perf_counter()
    for i in range(first, first + n):
        conn.execute(insert, (str(i),))
        write(schema, i)
        conn.commit()
    return (time.perf_counter() - start) / n * 1e6


if __name__ == "__main__":
    main()
