"""Plans of the dispatcher's statements, made as the dispatcher makes them.

:func:`backlog` fills the hot table as a busy outbox has it; :func:`explain` runs
one statement under EXPLAIN ANALYZE, after the store's own session statement or
under the server's settings, prepared (a generic plan, as the store runs its
per-batch statements) or not, in a transaction that is rolled back. Works on
every supported server version (EXPLAIN (GENERIC_PLAN) would need PostgreSQL 16).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg

from dispatchers.store.postgres import TIMEOUT_PARAMS, Store, timeout_values
from outbox._queries import Statement

_names = itertools.count()


def backlog(
    url: str,
    *,
    messages: int = 20_000,
    running: bool,
    destinations: int = 1,
    endpoints: int = 0,
) -> None:
    """``messages`` ready messages to ``destinations`` origins, or with ``endpoints``
    webhooks to that many endpoints in turn, analyzed; then, if ``running``, all
    claimed by 50 owners without a new ANALYZE: the statistics say that nothing
    runs, as they do after autovacuum analyzed an idle outbox."""
    with psycopg.connect(url) as conn:
        if endpoints:
            conn.execute(
                "INSERT INTO outbox.endpoints (url)"
                " SELECT 'https://e' || g || '.example/hook' FROM generate_series(1, %s) AS g",
                (endpoints,),
            )
            conn.execute(
                "INSERT INTO outbox.messages (idempotency_key, target, destination, endpoint_id,"
                " body, content_type, max_attempts)"
                " SELECT 'k' || g, 'endpoint:' || e.id, 'endpoint:' || e.id, e.id, '',"
                " 'application/json', 5"
                " FROM generate_series(1, %s) AS g"
                " JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n"
                "       FROM outbox.endpoints) AS e ON e.n = g %% %s",
                (messages, endpoints),
            )
        else:
            conn.execute(
                "INSERT INTO outbox.messages (idempotency_key, target, destination, url, body,"
                " content_type, max_attempts)"
                " SELECT 'k' || g, 'https://example.com', 'https://d' || g %% %s || '.example:443',"
                " 'https://example.com', '', 'text/plain', 5"
                " FROM generate_series(1, %s) AS g",
                (destinations, messages),
            )
        conn.execute("ANALYZE outbox.messages, outbox.endpoints")
        if running:
            conn.execute(
                "UPDATE outbox.messages SET state = 'running', attempts = 1,"
                " lease_owner = 'owner-' || id % 50, lease_until = now() + interval '1 minute'"
            )


def explain(
    url: str,
    statement: Statement,
    params: Mapping[str, Any],
    *,
    prepared: bool,
    store: Store | None = None,
) -> dict[str, Any]:
    """The plan (EXPLAIN (ANALYZE, FORMAT JSON)) of ``statement``, in a transaction
    that is rolled back. Prepared when ``prepared``: a generic plan, made on this
    server for the tables as they are now (as the store plans its per-batch
    statements, and as PostgreSQL may plan an application's statements once its
    driver prepares them). After ``store``'s session statement when given
    (``set_timeouts_prepared`` or ``set_timeouts``), else under the server's own
    settings, as a statement runs in the application's transaction."""
    values = dict(params)
    with psycopg.connect(url) as conn:
        cur = psycopg.ClientCursor(conn)
        if store is not None:
            bounds = timeout_values(store.config, 2.0)
            values.update(zip(TIMEOUT_PARAMS, bounds, strict=True))
            first = store.queries["set_timeouts_prepared" if prepared else "set_timeouts"]
            cur.execute(first.text, values)
        elif prepared:
            cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        if not prepared:
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement.text, values)
            plan: dict[str, Any] = cur.fetchone()[0][0]  # type: ignore[index]
            conn.rollback()
            return plan
        # A name of our own: a prepared statement outlives the rolled-back transaction.
        this = statement.prepared
        name = f"{this.name}_plan_{next(_names)}"
        cur.execute(this.prepare.replace(this.name, name, 1).replace("%%", "%"))
        cur.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + this.execute.replace(this.name, name, 1), values
        )
        plan = cur.fetchone()[0][0]  # type: ignore[index]
        conn.rollback()
        conn.execute(f"DEALLOCATE {name}")
        return plan


def nodes(plan: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of a JSON plan (the object EXPLAIN returns, or one of its nodes)."""
    stack = [plan.get("Plan", plan)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.get("Plans", []))


def seq_scans(plan: Mapping[str, Any], table: str) -> list[str]:
    """The aliases under which ``plan`` reads ``table`` whole."""
    return [
        node.get("Alias", table)
        for node in nodes(plan)
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") == table
    ]


def indexes(plan: Mapping[str, Any]) -> set[str]:
    """The indexes ``plan`` reads."""
    return {node["Index Name"] for node in nodes(plan) if "Index Name" in node}


def jit_available(url: str) -> bool:
    """Whether the server can JIT-compile (a build with LLVM, ``jit`` on)."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_jit_available() AND current_setting('jit') = 'on'").fetchone()
        return bool(row and row[0])


def index_names(url: str, name: str, schema: str = "outbox") -> set[str]:
    """Every name under which a plan may read index ``name`` of the history: the
    index itself and, where its table is partitioned (delivered, attempts), the
    index of each partition that a partitioned index ``name`` has, or, for a
    primary key ``<table>_pkey``, each partition's own primary key."""
    with psycopg.connect(url) as conn:
        names = {
            str(n)
            for (n,) in conn.execute(
                "SELECT c.relname FROM pg_class AS i, pg_partition_tree(i.oid) AS t"
                " JOIN pg_class AS c ON c.oid = t.relid"
                " WHERE i.relname = %s AND i.relnamespace = CAST(%s AS regnamespace)",
                (name, schema),
            )
        }
        if name.endswith("_pkey"):
            names |= {
                str(n)
                for (n,) in conn.execute(
                    "SELECT c.conname FROM pg_partition_tree(to_regclass(%s)) AS t"
                    " JOIN pg_constraint AS c ON c.conrelid = t.relid AND c.contype = 'p'",
                    (f"{schema}.{name.removesuffix('_pkey')}",),
                )
            }
    assert names, f"no index {name} in {schema}"
    return names


def reads_by(url: str, plan: str, name: str) -> bool:
    """Whether the text of ``plan`` reads index ``name`` (see :func:`index_names`)."""
    used = set(re.findall(r"(?:using|on) (\w+)", plan))
    return bool(used & index_names(url, name))


FEW = 100
"""Rows of a part of the history that a plan may read whole: one made ahead holds
none, and today's holds only the minutes since midnight UTC in a test whose rows
were written over the last hours (reading those is cheaper than an index)."""


def whole_reads(url: str, plan: str, table: str, schema: str = "outbox") -> list[str]:
    """The parts of ``table`` that hold more than :data:`FEW` rows (by their
    statistics) which the text of ``plan`` reads whole: the table itself, or its
    partitions."""
    with psycopg.connect(url) as conn:
        held = {
            str(n)
            for (n,) in conn.execute(
                "SELECT c.relname FROM pg_partition_tree(to_regclass(%s)) AS t"
                " JOIN pg_class AS c ON c.oid = t.relid WHERE t.isleaf AND c.reltuples > %s",
                (f"{schema}.{table}", FEW),
            )
        }
    return [part for part, scan in _seq_scans(plan) if part in held and not _mostly_kept(scan)]


def _seq_scans(plan: str) -> list[tuple[str, str]]:
    """Each ``Seq Scan`` of a text plan: the relation, and the node's lines."""
    found = []
    lines = plan.splitlines()
    for i, line in enumerate(lines):
        match = re.search(r"Seq Scan on (\w+)", line)
        if match:
            rest = [line]
            for after in lines[i + 1 :]:
                if "->" in after:
                    break
                rest.append(after)
            found.append((match.group(1), "\n".join(rest)))
    return found


def _mostly_kept(scan: str) -> bool:
    """Whether an analyzed scan kept at least as many rows as its filter removed:
    a part read whole for rows most of which the statement asked for (today's
    partition in the hour after midnight UTC, under a window of the last hour) is
    read the cheapest way. A plan without actual rows never says so."""
    kept = re.search(r"actual time=[\d.]+\.\.[\d.]+ rows=(\d+)", scan)
    if kept is None:
        return False
    removed = re.search(r"Rows Removed by Filter: (\d+)", scan)
    return int(kept.group(1)) >= (int(removed.group(1)) if removed else 0)


def today_partitions(url: str) -> set[str]:
    """The names of today's (UTC, by the server's clock) partitions of the history:
    the one part whose rows a window of the last hour may be a large share of,
    depending on the hour the test runs at."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')").fetchone()
    assert row is not None
    return {f"delivered_p{row[0]}", f"attempts_p{row[0]}"}


def history_with_rows(url: str, schema: str = "outbox") -> set[str]:
    """The partitions of the history that hold more than :data:`FEW` rows."""
    with psycopg.connect(url) as conn:
        names = [n for (n,) in conn.execute(f"SELECT partition FROM {schema}.history_partitions()")]
        return {
            name
            for name in names
            if (conn.execute(f"SELECT count(*) FROM {schema}.{name}").fetchone() or (0,))[0] > FEW
        }
