"""Read a finished run's history: the audit, the final rows, the inbox's effects,
the receivers' requests and the dispatchers' logs, into a :class:`History`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from tests.history import audit
from tests.history.history import (
    AttemptRow,
    FinalMessage,
    HealthEvent,
    History,
    LockWait,
    MessageEvent,
    Request,
    SlotEvent,
    Timing,
    Txn,
)
from tests.history.producers import resolve
from tests.history.receiver import INBOX

if TYPE_CHECKING:
    from tests.history.run import Harness

FINALS = """
SELECT id, idempotency_key, target, destination, ordering_key, state, attempts,
       max_attempts, last_error, last_status
FROM outbox.messages
UNION ALL
SELECT d.id, d.idempotency_key, d.target, COALESCE(m.destination, d.target), d.ordering_key,
       'delivered', d.attempts, d.max_attempts, NULL, d.last_status
FROM outbox.delivered AS d
LEFT JOIN LATERAL (
    SELECT e.destination FROM history_audit.message_events AS e
    WHERE e.id = d.id AND e.op = 'insert' LIMIT 1
) AS m ON true
"""
ATTEMPTS = """
SELECT message_id, attempt, owner,
       CAST(extract(epoch FROM started_at) AS float8) AS started_at, duration_ms, status,
       outcome, error_class
FROM outbox.attempts ORDER BY message_id, attempt
"""


def collect(
    harness: Harness,
    *,
    seed: int,
    timing: Timing,
    txns: list[Txn],
    requests: list[dict[str, Any]],
    lock_waits: list[LockWait],
) -> History:
    url = harness.url
    with psycopg.connect(url, application_name="history-harness") as conn:
        message_events = [MessageEvent(**row) for row in _events(conn, "message_events")]
        health_events = [HealthEvent(**row) for row in _events(conn, "health_events")]
        slot_events = [SlotEvent(**row) for row in _events(conn, "slot_events")]
        cur = conn.cursor(row_factory=dict_row)
        finals = [FinalMessage(**row) for row in cur.execute(FINALS).fetchall()]
        attempts = [AttemptRow(**row) for row in cur.execute(ATTEMPTS).fetchall()]
        effects = {
            str(key): int(n)
            for key, n in conn.execute(
                f"SELECT key, count(*) FROM {INBOX}.effects GROUP BY key"
            ).fetchall()
        }
    return History(
        seed=seed,
        timing=timing,
        destinations=tuple(harness.destinations.values()),
        txns=tuple(resolve(url, txns)),
        requests=tuple(_request(x) for x in requests if "control" not in x),
        message_events=tuple(message_events),
        health_events=tuple(health_events),
        slot_events=tuple(slot_events),
        attempts=tuple(attempts),
        finals=tuple(finals),
        effects=effects,
        processes=tuple(harness.fleet.processes()),
        faults=tuple(sorted([*harness.faults, *harness.fleet.faults], key=lambda f: f.at)),
        policies=tuple(harness.policies),
        operations=tuple(harness.operations),
        lock_waits=tuple(lock_waits),
        notes=tuple([*harness.notes, *harness.fleet.notes]),
    )


def _events(conn: psycopg.Connection[Any], table: str) -> list[dict[str, Any]]:
    return audit.read(conn, table)


def _request(line: dict[str, Any]) -> Request:
    return Request(
        destination=line["destination"],
        key=line["key"],
        arrival=line["arrival"],
        end=line["end"] if line["end"] is not None else line["arrival"],
        end_kind=line["end_kind"],
        status=line["status"],
        behavior=line["behavior"],
        effect=line["effect"],
        signature=line["signature"],
        connection=line["connection"],
    )
