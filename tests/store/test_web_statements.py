"""Every statement of the web surfaces' catalog (``dispatchers/store/web/sql``),
planned as a surface runs it, on every server installed.

On tables as a busy outbox has them (a queue of 20,000 messages to 4,020
endpoints of 2,000 tenants, a third of it dead, a month of history, 2,000 API
tokens and 20,000 audit entries), each statement runs under EXPLAIN ANALYZE in
the transaction a surface gives it (read-only and bounded for a read, bounded
for a write), for the operator and for a tenant: it reaches its rows through
the indexes named here, reads no big table whole, and is never JIT-compiled.
A statement added to the catalog without a case here fails the first test.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from dispatchers.bench.env import bench_queries
from dispatchers.store.statements import web_queries
from dispatchers.ui.store import BOUNDED, READ_ONLY
from tests.conftest import PgServer
from tests.plans import backlog, history_with_rows, index_names, indexes, nodes, today_partitions

pytestmark = pytest.mark.every_server  # each installed version, not only the run's

BIG = {"messages", "endpoints", "tenants", "api_tokens", "audit_log"}
"""The tables no statement reads whole (but those that list every row)."""

WRITES = {"web_endpoint_lock", "web_token_insert", "web_token_revoke", "web_token_find",
          "web_audit_insert"}  # fmt: skip
"""The statements that run in a surface's writing transaction."""


@pytest.fixture(scope="module")
def busy(pg_server: PgServer, template_url: str) -> Iterator[dict[str, Any]]:
    """The busy outbox, shared by the module's tests (which only read it: the
    EXPLAIN ANALYZE of a write is rolled back), and the values its statements
    are planned for."""
    name = f"outbox_web_plans_{id(pg_server)}"
    url = pg_server.create_database(name, template=pg_server.template)
    try:
        yield _fill(url)
    finally:
        pg_server.drop_database(name)


def _fill(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        seed = bench_queries("outbox")["seed_history"]
        conn.execute(seed, {"target": "https://example.com", "rows": 20_000, "body": b""})
        for table, column, columns in (
            ("attempts", "message_id", ("started_at",)),
            ("delivered", "id", ("created_at", "completed_at")),
        ):
            shift = ", ".join(f"{c} = {c} - ({column} % 30) * interval '1 day'" for c in columns)
            conn.execute(f"UPDATE outbox.{table} SET {shift}")
    backlog(url, running=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'o',"
            " lease_until = now() + interval '1 minute' WHERE id % 10 = 0"
        )
        conn.execute(
            "INSERT INTO outbox.tenants (external_id)"
            " SELECT 'customer-' || g FROM generate_series(1, 2000) AS g"
        )
        conn.execute(
            "INSERT INTO outbox.endpoints (url, tenant_id)"
            " SELECT 'https://t' || t.id || '-' || g || '.example/hook', t.id"
            " FROM outbox.tenants AS t, generate_series(1, 2) AS g"
        )
        conn.execute(
            "INSERT INTO outbox.endpoints (url)"
            " SELECT 'https://own' || g || '.example/hook' FROM generate_series(1, 20) AS g"
        )
        for table, destination in (
            ("messages", ", destination = 'endpoint:' || e.id"),
            ("delivered", ""),
        ):
            conn.execute(
                f"UPDATE outbox.{table} AS x"
                f" SET endpoint_id = e.id, target = 'endpoint:' || e.id, url = NULL{destination}"
                " FROM (SELECT id, row_number() OVER (ORDER BY id) - 1 AS n"
                "       FROM outbox.endpoints) AS e"
                " WHERE x.id % 2 = 0 AND e.n = (x.id / 2) % 4020"
            )
        conn.execute(
            "UPDATE outbox.messages SET state = 'dead',"
            " completed_at = now() - (id % 100) * interval '1 minute'"
            " WHERE id % 3 = 0 AND state = 'ready'"
        )
        conn.execute(
            "INSERT INTO outbox.destination_health (destination, state, blocked_until)"
            " SELECT 'https://h' || g || '.example:443', 'held', now() - interval '1 hour'"
            " FROM generate_series(1, 2000) AS g"
        )
        conn.execute(
            "INSERT INTO outbox.api_tokens (name, scope, token_sha256, shown_prefix)"
            " SELECT 't' || g, 'read', sha256(CAST(CAST(g AS text) AS bytea)),"
            "        'obx_' || lpad(CAST(g AS text), 4, '0')"
            " FROM generate_series(1, 2000) AS g"
        )
        conn.execute(
            "INSERT INTO outbox.audit_log (token_id, token_name, action, resource, detail)"
            " SELECT 1, 't1', 'update', 'endpoint', '{}' FROM generate_series(1, 20000)"
        )
        conn.execute("ANALYZE")
        tenant = conn.execute(
            "SELECT id FROM outbox.tenants WHERE external_id = 'customer-7'"
        ).fetchone()
        endpoint = conn.execute(
            "SELECT id FROM outbox.endpoints WHERE tenant_id = %s ORDER BY id LIMIT 1", tenant
        ).fetchone()
        message = conn.execute(
            "SELECT max(id) FROM outbox.delivered WHERE endpoint_id = %s", endpoint
        ).fetchone()
    assert tenant and endpoint and message and message[0] is not None
    return {"url": url, "tenant_id": tenant[0], "endpoint_id": endpoint[0], "id": message[0]}


SEARCH = dict.fromkeys(
    ("key", "event_type", "endpoint_id", "state", "created_from", "created_until", "body")
) | {"before": None, "after": None, "untenanted": False, "scan": 100, "limit": 100}

# name: (its parameters but the tenant's, the indexes its plan reads, the tables
# it may read whole because it returns every row of them)
CASES: dict[str, tuple[dict[str, Any], set[str], set[str]]] = {
    "web_endpoint_get": ({"id": "endpoint"}, set(), set()),
    "web_endpoint_lock": ({"id": "endpoint"}, set(), set()),
    "web_endpoint_page": (
        {"after": 0, "limit": 101, "enabled": None, "attention": False, "untenanted": False},
        set(),
        set(),
    ),
    "web_endpoint_backlog": ({"ids": "page"}, {"messages_endpoint_idx"}, set()),
    # the tenants of a page's endpoints: hashed whole when that is cheaper
    "web_endpoint_tenants": ({"ids": "page"}, {"endpoints_pkey"}, {"tenants"}),
    "web_tenant_id": ({"external_id": "customer-7"}, {"tenants_external_id_key"}, set()),
    "web_sealed_secrets": ({}, set(), set()),
    "web_messages": (SEARCH, {"messages_pkey"}, set()),
    "web_messages_newer": (SEARCH | {"after": 5000}, {"messages_pkey"}, set()),
    # the portal's, for a tenant (the operator's are every endpoint's)
    "web_deliveries": ({"endpoint_id": None, "limit": 100}, set(), {"endpoints"}),
    "web_message": ({"id": "message"}, {"messages_pkey"}, set()),
    "web_message_visible": ({"id": "message"}, {"messages_pkey"}, set()),
    "web_dead_page": (
        {
            "endpoint_id": None,
            "event_type": None,
            "since": None,
            "untenanted": False,
            "before": 2**62,
            "limit": 101,
        },
        {"messages_pkey"},
        set(),
    ),
    "web_dead_ids": (
        {"ids": None, "endpoint_id": "endpoint", "event_type": None, "since": None, "limit": 100},
        {"messages_endpoint_idx"},
        set(),
    ),
    "web_message_attempts": ({"id": "message"}, {"attempts_pkey"}, set()),
    "web_endpoint_attempts": (
        {"endpoint_id": "endpoint", "limit": 20},
        {"attempts_started_idx"},
        set(),
    ),
    "web_minutes": ({}, {"attempts_started_idx"}, set()),
    "web_hours": ({"since": "hour_ago", "until": "now"}, {"attempts_started_idx"}, set()),
    "web_dispatchers": ({}, {"attempts_started_idx", "messages_lease_idx"}, set()),
    "web_endpoint_hour": ({"endpoint_id": "endpoint"}, {"attempts_started_idx"}, set()),
    "web_endpoints_hour": ({}, {"attempts_started_idx"}, set()),
    "web_destination_health": ({"destination": "x"}, {"destination_health_pkey"}, set()),
    "web_token_insert": (
        {
            "name": "n",
            "scope": "read",
            "tenant": "customer-7",
            "digest": b"d" * 32,
            "shown_prefix": "obx_dddd",
        },
        {"tenants_external_id_key"},
        set(),
    ),
    "web_token_list": ({}, set(), {"api_tokens", "tenants"}),
    "web_token_revoke": ({"id": 7}, {"api_tokens_pkey"}, set()),
    "web_token_find": ({"digest": b"d" * 32}, {"api_tokens_token_sha256_key"}, set()),
    "web_audit_insert": (
        {
            "token_id": 1,
            "token_name": "t1",
            "tenant_id": None,
            "action": "update",
            "resource": "endpoint",
            "resource_id": "1",
            "before": None,
            "after": None,
            "detail": "{}",
        },
        set(),
        set(),
    ),
    "web_audit_page": ({"before": 10_000, "limit": 101}, {"audit_log_pkey"}, set()),
    "web_cursor_key": ({}, set(), set()),
}


TENANT_USES: dict[str, set[str]] = {
    # a tenant's rows are found from its endpoints (endpoints_tenant_idx)
    "web_endpoint_page": {"endpoints_tenant_idx"},
    "web_messages": {"endpoints_tenant_idx", "messages_endpoint_idx"},
    "web_messages_newer": {"endpoints_tenant_idx", "messages_endpoint_idx"},
    "web_deliveries": {"endpoints_tenant_idx", "messages_endpoint_idx"},
}
"""The indexes a statement reads for a tenant, where they differ from the operator's."""


def _values(busy: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    now = datetime.now(UTC)
    named = {
        "endpoint": busy["endpoint_id"],
        "message": busy["id"],
        "page": list(range(1, 101)),
        "hour_ago": now - timedelta(hours=1),
        "now": now,
    }
    return {k: named.get(v, v) if isinstance(v, str) else v for k, v in params.items()}


def _plan(url: str, name: str, values: dict[str, Any], *, seqscan: bool = True) -> dict[str, Any]:
    """The analyzed plan of ``name`` for ``values``; with ``seqscan`` False, the
    plan the server takes when sequential scans are priced out (and JIT off, which
    that price would set off)."""
    statement = web_queries("outbox")[name]
    with psycopg.connect(url) as conn:
        cur = psycopg.ClientCursor(conn)
        cur.execute(BOUNDED if name in WRITES else READ_ONLY)
        if not seqscan:
            cur.execute("SET LOCAL enable_seqscan = off; SET LOCAL jit = off")
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement.text, values)
        row = cur.fetchone()
        conn.rollback()
    assert row is not None
    plan: dict[str, Any] = row[0][0]
    return plan


def _reads(url: str, read: set[str], index: str) -> bool:
    """Whether a plan that reads ``read`` reads ``index`` (of the history: of
    one of its partitions)."""
    history = index.startswith(("attempts_", "delivered_"))
    return index in read or (history and bool(index_names(url, index) & read))


def _history_with_rows(url: str) -> set[str]:
    return history_with_rows(url)


def test_every_statement_of_the_web_catalog_has_a_case() -> None:
    assert sorted(CASES) == sorted(web_queries("outbox").names())


@pytest.mark.parametrize("scope", ["operator", "tenant"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_each_web_statement_reaches_its_rows_by_index_without_jit(
    busy: dict[str, Any], name: str, scope: str
) -> None:
    params, uses, whole = CASES[name]
    text = web_queries("outbox")[name].text
    values = _values(busy, params)
    if "%(tenant_id)s" in text:
        values["tenant_id"] = busy["tenant_id"] if scope == "tenant" else None
    elif scope == "tenant":
        pytest.skip("the operator's only")
    plan = _plan(busy["url"], name, values)
    assert "JIT" not in plan, (name, plan)
    big = (BIG | _history_with_rows(busy["url"])) - whole
    if _read_whole(plan) & big and _read_whole(plan) & big <= today_partitions(busy["url"]):
        # today's partition holds only the hours since midnight UTC, and under a
        # window of the last hour the planner may find a share of them cheaper to
        # read whole; what is judged is then the plan it takes with sequential
        # scans priced out, which reads each part through an index if one serves
        plan = _plan(busy["url"], name, values, seqscan=False)
    read_whole = _read_whole(plan)
    assert read_whole & big == set(), (name, plan)
    if scope == "tenant":
        uses = TENANT_USES.get(name, uses)
    read = indexes(plan)
    unread = [index for index in uses if not _reads(busy["url"], read, index)]
    history = ("attempts_", "delivered_")
    scans = [n for n in nodes(plan) if n.get("Relation Name", "").startswith(history)]
    if scans and all(n["Node Type"] == "Seq Scan" for n in scans):
        # the history reached only through parts read for most of their rows (a
        # window inside today's partition) needs none of its indexes; one read
        # for a minority of its rows was refused above
        unread = [index for index in unread if not index.startswith(history)]
    assert unread == [], (name, unread, read)


def _read_whole(plan: dict[str, Any]) -> set[str]:
    """The relations ``plan`` scans whole that its filter removed more rows of
    than it kept (a part read whole for rows most of which were asked for is read
    the cheapest way)."""
    return {
        node["Relation Name"]
        for node in nodes(plan)
        if node["Node Type"] == "Seq Scan"
        and "Relation Name" in node
        and node.get("Actual Rows", 0) < node.get("Rows Removed by Filter", 0)
    }
