"""What the guards of migration 0034 cost a producer, against the same schema
without them, in turns, in one run.

0034 adds to ``messages`` a CHECK (an endpoint's message names no URL, and its
destination is the endpoint's) and a BEFORE INSERT trigger whose ``WHEN`` clause
is false for every message the library writes; and the library finds a key
through the functions ``key_taken_before`` and ``key_lookup`` (run as the
schema's owner) instead of reading ``message_keys`` itself. Two schemas at 0034:
one as migrated, one with the CHECK and the trigger dropped, written to by an
``Outbox`` whose statements read the keys inline as before 0034. Each round
writes ``-n`` messages to each schema, one transaction each (a business insert,
the enqueue or the publish to one endpoint, the commit), alternating the schemas
round by round; the median and the least of the rounds' µs per transaction are
printed. Then the CHECK and the trigger alone, apart from the client and the
commit: ``--rows`` plain and endpoint messages inserted by one statement into
each schema in turns (µs per row).

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
from outbox._queries import Queries, Statement, queries_for
from outbox.endpoints import Endpoints

BEFORE = {
    # enqueue: whether the previous generation holds the key
    "NOT {q}.key_taken_before(%(target)s, %(idempotency_key)s)": (
        "NOT EXISTS (SELECT FROM {q}.message_keys_old AS k"
        " WHERE k.target = %(target)s AND k.idempotency_key = %(idempotency_key)s)"
    ),
    # publish: each endpoint's key, in either generation
    "LEFT JOIN LATERAL {q}.key_lookup(s.target, s.idempotency_key) AS k ON true": (
        "LEFT JOIN LATERAL (SELECT k.message_id FROM {q}.message_keys AS k"
        " WHERE k.target = s.target AND k.idempotency_key = s.idempotency_key"
        " UNION ALL SELECT k.message_id FROM {q}.message_keys_old AS k"
        " WHERE k.target = s.target AND k.idempotency_key = s.idempotency_key"
        " LIMIT 1) AS k ON true"
    ),
}
"""What 0034 made a function call, and the inline read it replaced."""


def inline(schema: str) -> Queries:
    """The library's statements for ``schema``, reading keys inline as before 0034."""
    queries = Queries(schema)
    q = sql.Identifier(schema).as_string(None)
    for name in ("enqueue", "enqueue_notify", "publish", "publish_notify"):
        text = queries[name].text
        for now, before in BEFORE.items():
            if now.format(q=q) in text:
                text = text.replace(now.format(q=q), before.format(q=q))
        assert text != queries[name].text, name
        queries._statements[name] = Statement(name, text)
    return queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url")
    parser.add_argument("-n", type=int, default=500, help="transactions per round and schema")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each schema")
    parser.add_argument("--rows", type=int, default=50_000, help="rows per INSERT ... SELECT")
    args = parser.parse_args()
    with database(args.database_url) as db, ExitStack() as stack:
        schemas = {
            "before": stack.enter_context(fresh_schema(db.url)),
            "0034": stack.enter_context(fresh_schema(db.url)),
        }
        conn = stack.enter_context(connect(db.url))
        unguarded = sql.Identifier(schemas["before"], "messages")
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP CONSTRAINT messages_endpoint_alone").format(unguarded)
        )
        conn.execute(sql.SQL("DROP TRIGGER messages_insert_check ON {}").format(unguarded))
        boxes = {"before": Outbox(schema=schemas["before"]), "0034": Outbox(schema=schemas["0034"])}
        boxes["before"].queries = inline(schemas["before"])
        assert boxes["0034"].queries is queries_for(schemas["0034"])
        for schema in schemas.values():
            Endpoints(schema=schema).add(conn, url="https://bench.example/hooks")
            conn.execute(sql.SQL("CREATE TABLE {}.orders (id text)").format(sql.Identifier(schema)))
        conn.commit()
        tag = run_id()

        def enqueue(version: str, i: int) -> None:
            boxes[version].enqueue(
                conn,
                url="https://bench.example/orders",
                idempotency_key=f"{tag}-e{i}",
                json={"n": i},
            )

        def publish(version: str, i: int) -> None:
            boxes[version].publish(conn, "order.paid", {"n": i}, idempotency_key=f"{tag}-p{i}")

        results: dict[str, dict[str, list[float]]] = {}
        for name, write in (("enqueue", enqueue), ("publish", publish)):
            spent: dict[str, list[float]] = {version: [] for version in schemas}
            done = 0
            for r in range(2 * args.rounds):
                version = list(schemas)[r % 2]
                spent[version].append(timed(conn, schemas[version], version, write, done, args.n))
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
    print(f"{'producer':<16}{'before':>10}{'0034':>10}{'ratio':>8}{'least before':>14}{'0034':>10}")
    for name, spent in results.items():
        before, after = statistics.median(spent["before"]), statistics.median(spent["0034"])
        print(
            f"{name:<16}{before:>10.1f}{after:>10.1f}{after / before:>8.3f}"
            f"{min(spent['before']):>12.1f}{min(spent['0034']):>10.1f}"
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


def timed(
    conn: Any, schema: str, version: str, write: Callable[[str, int], None], first: int, n: int
) -> float:
    """µs per transaction of ``n`` business transactions that each call ``write``."""
    insert = sql.SQL("INSERT INTO {}.orders VALUES (%s)").format(sql.Identifier(schema))
    start = time.perf_counter()
    for i in range(first, first + n):
        conn.execute(insert, (str(i),))
        write(version, i)
        conn.commit()
    return (time.perf_counter() - start) / n * 1e6


if __name__ == "__main__":
    main()
