"""The autoscalers in examples/deploy scale on figures the outbox stands behind:
KEDA's backlog query counts what ``outbox status`` calls ready, stays on the
claimable index, and stops counting where the scaler asks for every replica."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from dispatchers.runtime.metrics import Metrics
from outbox import Outbox
from outbox.admin import status

DEPLOY = Path(__file__).resolve().parents[2] / "examples" / "deploy"
KEDA = (DEPLOY / "keda-scaledobject.yaml").read_text()


def keda_field(name: str) -> str:
    match = re.search(rf"^\s*{name}: \"?(\w+)\"?$", KEDA, re.MULTILINE)
    assert match, name
    return match.group(1)


def keda_query() -> str:
    """The ``query: |`` block scalar: the lines indented deeper than its key."""
    head = re.search(r"^( *)query: \|\n", KEDA, re.MULTILINE)
    assert head
    lines = []
    for line in KEDA[head.end() :].splitlines():
        if line.strip() and len(line) - len(line.lstrip()) <= len(head.group(1)):
            break
        lines.append(line)
    return "\n".join(lines)


def backlog(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    (count,) = conn.execute(keda_query()).fetchone() or (None,)
    assert isinstance(count, int)
    return count


def test_both_autoscalers_scale_the_deployment_whose_grace_is_checked() -> None:
    # kubernetes.yaml's terminationGracePeriodSeconds is checked against --grace
    # in test_examples; a scaled-away pod gets it
    deployment = (DEPLOY / "kubernetes.yaml").read_text()
    assert re.search(r"^kind: Deployment\nmetadata:\n  name: outbox-dispatch$", deployment, re.M)
    assert re.search(r"scaleTargetRef:\n    name: outbox-dispatch$", KEDA, re.M)
    hpa = (DEPLOY / "hpa-prometheus.yaml").read_text()
    assert re.search(r"kind: Deployment\n    name: outbox-dispatch$", hpa, re.M)
    assert int(keda_field("minReplicaCount")) >= 2
    assert re.search(r"^  minReplicas: [2-9]$", hpa, re.M)


def test_the_hpa_scales_on_a_metric_the_dispatchers_serve() -> None:
    hpa = (DEPLOY / "hpa-prometheus.yaml").read_text()
    named = set(re.findall(r"^ +name: (outbox_\w+)$", hpa, re.M))
    named |= set(re.findall(r"seriesQuery: '(outbox_\w+)\{", hpa))
    served = {family.name for family in Metrics().registry.collect()}
    assert named == {"outbox_messages_ready"} and named <= served, (named, served)


def test_the_keda_query_counts_what_outbox_status_calls_ready(database_url: str) -> None:
    box = Outbox()
    with psycopg.connect(database_url, autocommit=True) as conn:
        for i in range(3):
            box.enqueue(conn, url="https://example.com/due", idempotency_key=f"due-{i}", json={})
        later = datetime.now(UTC) + timedelta(hours=1)
        box.enqueue(
            conn,
            url="https://example.com/later",
            idempotency_key="later",
            json={},
            available_at=later,
        )
        for state in ("running", "dead"):
            conn.execute(
                "UPDATE outbox.messages SET state = %s, lease_owner = %s, lease_until = %s"
                " WHERE id = (SELECT min(id) FROM outbox.messages WHERE state = 'ready')",
                (state, *(("o", later) if state == "running" else (None, None))),
            )
        messages = status(conn)["messages"]
        assert backlog(conn) == messages["ready"] == 1
        assert messages["scheduled"] == messages["running"] == messages["dead"] == 1


@pytest.mark.slow
def test_the_keda_query_stops_where_every_replica_is_asked_for(database_url: str) -> None:
    cap = int(keda_field("targetQueryValue")) * int(keda_field("maxReplicaCount"))
    assert f"LIMIT {cap}" in keda_query()
    with psycopg.connect(database_url, autocommit=True) as conn:
        Outbox().enqueue(conn, url="https://example.com/due", idempotency_key="first", json={})
        copy_message(conn, count=cap + 500, state="ready")
        assert backlog(conn) == cap


@pytest.mark.slow
def test_the_keda_query_stays_on_the_claimable_index_beside_dead_messages(
    database_url: str,
) -> None:
    # a backlog past the cap beside more dead messages: the shape in which a
    # LIMIT-ed count can look cheaper as a sequential scan that meets due rows early
    with psycopg.connect(database_url, autocommit=True) as conn:
        Outbox().enqueue(conn, url="https://example.com/due", idempotency_key="first", json={})
        copy_message(conn, count=5_000, state="dead")
        copy_message(conn, count=2_500, state="ready")
        conn.execute("ANALYZE outbox.messages")
        plan = "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + keda_query()))
    assert "messages_claimable_idx" in plan, plan
    assert "Seq Scan" not in plan, plan


def copy_message(conn: psycopg.Connection[tuple[object, ...]], *, count: int, state: str) -> None:
    """``count`` copies of the first message in ``state``, with their own ids and
    keys (whatever columns the schema has)."""
    conn.execute(
        "INSERT INTO outbox.messages"
        " SELECT (jsonb_populate_record(NULL::outbox.messages, to_jsonb(m) || jsonb_build_object("
        "     'id', nextval(pg_get_serial_sequence('outbox.messages', 'id')),"
        "     'idempotency_key', 'copy-' || g,"
        "     'state', %(state)s::text,"
        "     'completed_at', CASE WHEN %(state)s = 'dead' THEN now() END))).*"
        " FROM outbox.messages AS m, generate_series(1, %(count)s) AS g"
        " WHERE m.id = (SELECT min(id) FROM outbox.messages)",
        {"state": state, "count": count},
    )
