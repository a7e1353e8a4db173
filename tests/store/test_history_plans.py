"""Every statement that reads the history (delivered, attempts) keeps index-bounded
plans once the history is partitioned (migration 0032): over a week of daily
partitions holding rows, each reads its partitions through their indexes (an
Append or MergeAppend of index scans), never one that holds rows whole. The
windows asked for are an hour: a statement asked for a whole day may read that
day's partition whole, which is then the cheapest way to all of its rows.

The statements are the operator's (admin.sql: show, replay, purge, status, expunge),
the web surfaces' (the dashboard, the management API, the consumer portal) and the
dispatcher's own (retention, the keys of a partition, the rescue's check of an attempt, the
recorded attempts), each run under EXPLAIN ANALYZE with values it is given in use.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from dispatchers.store.statements import store_queries, web_queries
from outbox._queries import Statement, queries_for
from tests.conftest import PgServer
from tests.plans import explain, nodes
from tests.store.test_partitions import add_past_days, today

pytestmark = pytest.mark.every_server  # each installed version, not only the run's

DAYS = 7
PER_DAY = 4000

HISTORY = """
INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, url, method, headers,
                              body, content_type, event_type, attempts, max_attempts,
                              created_at, completed_at)
SELECT g, 'k-' || g, 'endpoint:' || e.id, e.id, NULL, 'POST', '{}', '', 'application/json',
       'order.paid', 1, 5, %(day)s + (g %% %(per_day)s) * interval '20 s',
       %(day)s + (g %% %(per_day)s) * interval '20 s'
FROM generate_series(CAST(%(first)s AS bigint), %(last)s) AS g
JOIN (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n FROM outbox.endpoints) AS e
  ON e.n = g %% 10;
INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, status, outcome)
SELECT g, 1, 'someone', %(day)s + (g %% %(per_day)s) * interval '20 s', 200, 'delivered'
FROM generate_series(CAST(%(first)s AS bigint), %(last)s) AS g
"""


@pytest.fixture(scope="module")
def history(pg_server: PgServer, template_url: str) -> Iterator[str]:
    """A week of daily partitions of PER_DAY rows each (ten endpoints' webhooks
    with one attempt each), analyzed; shared by the module's tests, which only
    read it (EXPLAIN ANALYZE of a write is rolled back)."""
    name = f"outbox_history_plans_{id(pg_server)}"
    url = pg_server.create_database(name, template=pg_server.template)
    try:
        add_past_days(url, DAYS)
        with psycopg.connect(url) as conn:
            conn.execute(
                "INSERT INTO outbox.endpoints (url)"
                " SELECT 'https://e' || g || '.example/hook' FROM generate_series(1, 10) AS g"
            )
            for n in range(DAYS):
                day = today() - timedelta(days=DAYS - n)
                first = n * PER_DAY + 1
                for statement in HISTORY.strip().split(";\n"):
                    conn.execute(
                        statement,
                        {
                            "day": day,
                            "first": first,
                            "last": first + PER_DAY - 1,
                            "per_day": PER_DAY,
                        },
                    )
            conn.execute("ANALYZE outbox.delivered, outbox.attempts, outbox.endpoints")
            endpoint = conn.execute("SELECT min(id) FROM outbox.endpoints").fetchone()
        assert endpoint is not None
        yield url
    finally:
        pg_server.drop_database(name)


def _endpoint(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT min(id) FROM outbox.endpoints").fetchone()
    assert row is not None
    return int(row[0])


MIDDLE = 3 * PER_DAY + 17  # a delivered message of the fourth day


def values(url: str) -> dict[str, Any]:
    """A value in use for every parameter the statements take."""
    now = datetime.now(UTC)
    return {
        "id": MIDDLE,
        "ids": [MIDDLE],
        "endpoint_id": _endpoint(url),
        # an hour two days ago: a window of one partition
        "since": now - timedelta(days=2),
        "until": now - timedelta(days=2) + timedelta(hours=1),
        "before": None,
        "budget": 100,
        "limit": 50,
        "tenant": None,
        "tenant_id": None,
        "untenanted": False,
        "body": None,
        "scan": 50,
        "event_type": None,
        "event_key": "evt-1",
        "key": None,
        "created_from": None,
        "created_until": None,
        "state": None,
        "scope": "endpoint",
        "selector": "endpoint",
        "marker": "expunged",
        "retention_s": 7 * 86400.0,
        "delivered_floor": today() - timedelta(days=DAYS),
        "attempts_floor": today() - timedelta(days=DAYS),
        "lower": today() - timedelta(days=DAYS),
        "upper": today() - timedelta(days=DAYS - 1),
        "after": 0,
        "owner": "someone",
        "attempts": [1],
        "outcomes": ["delivered"],
    }


READERS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "library": (
        queries_for,
        (
            "message_get",
            "message_attempts",
            "replay",
            "replay_endpoint",
            "replay_message",
            "replay_message_endpoint",
            "replay_event",
            "dead_purge",
            "status_counts",
        ),
    ),
    # the web surfaces' (the dashboard, the management API, the portal)
    "web": (
        web_queries,
        (
            "web_endpoint_attempts",
            "web_endpoint_hour",
            "web_endpoints_hour",
            "web_hours",
            "web_minutes",
            "web_dispatchers",
            "web_message_visible",
            "web_messages",
            "web_messages_newer",
            "web_message",
            "web_message_attempts",
            "web_deliveries",
        ),
    ),
    "dispatcher": (
        store_queries,
        ("retention", "recorded_attempts", "rescue"),
    ),
}

CASES = [(family, name) for family, (_, names) in READERS.items() for name in names]


def row_counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT h.partition, c.reltuples FROM outbox.history_partitions() AS h"
            " JOIN pg_class AS c ON c.relname = h.partition"
            " AND c.relnamespace = CAST('outbox' AS regnamespace)"
        ).fetchall()
    return {name: int(tuples) for name, tuples in rows}


@pytest.mark.parametrize(("family", "name"), CASES, ids=[n for _, n in CASES])
def test_each_reader_of_the_history_reaches_its_partitions_by_index(
    history: str, family: str, name: str
) -> None:
    statement: Statement = READERS[family][0]("outbox")[name]
    params = {k: v for k, v in values(history).items() if f"%({k})s" in statement.text}
    plan = explain(history, statement, params, prepared=False)
    full = {p for p, tuples in row_counts(history).items() if tuples > 0}
    assert len(full) == DAYS * 2
    whole = [
        node["Relation Name"]
        for node in nodes(plan)
        if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in full
    ]
    assert whole == [], (name, whole)
