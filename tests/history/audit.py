"""What the database saw: triggers that record every change of the rows the
protocol moves, installed in a run's own database before anything else runs.

The triggers only insert into tables of their own schema (:data:`AUDIT`); they
change nothing the outbox reads, and roll back with the transaction that fired
them, so the record holds exactly the committed changes. Each row carries:

- ``at``: ``clock_timestamp()`` when the row changed (inside the statement, before
  its commit), and ``txn_start``: ``now()``, the start of the writer's transaction,
  the time the protocol's own statements compare leases and rate slots against;
  both as seconds since the epoch, the clock the receivers stamp with (the server
  runs on this host);
- ``xid``: the writer's transaction id, so that changes made together (a claim and
  the probe it took) are known to be;
- ``app``: the writer's ``application_name``: each dispatcher process, producer and
  the harness names its sessions (``PGAPPNAME``), so every write is attributed.

Tables recorded: ``messages`` (every insert, claim, renewal, completion, rescue,
release), ``destination_health`` (breakers and holds), ``destination_slots``
(who holds which concurrency slot) and, where it exists, ``unseated_requests``.
A renewal is one row per lease per heartbeat: a short run writes a few thousand
rows.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

AUDIT = "history_audit"
"""The schema of the record."""

_DDL = """
CREATE SCHEMA {audit};

CREATE TABLE {audit}.message_events (
    seq              bigserial PRIMARY KEY,
    at               double precision NOT NULL DEFAULT extract(epoch FROM clock_timestamp()),
    txn_start        double precision NOT NULL DEFAULT extract(epoch FROM now()),
    xid              bigint NOT NULL DEFAULT CAST(CAST(pg_current_xact_id() AS text) AS bigint),
    app              text NOT NULL DEFAULT current_setting('application_name'),
    op               text NOT NULL,
    id               bigint NOT NULL,
    destination      text,
    ordering_key     text,
    idempotency_key  text,
    target           text,
    old_state        text,
    new_state        text,
    old_attempts     integer,
    new_attempts     integer,
    old_owner        text,
    new_owner        text,
    old_lease_until  double precision,
    new_lease_until  double precision,
    last_error       text,
    last_status      integer
);

CREATE FUNCTION {audit}.message_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {audit}.message_events (
            op, id, destination, ordering_key, idempotency_key, target, new_state,
            new_attempts, new_owner, new_lease_until, last_error, last_status)
        VALUES ('insert', NEW.id, NEW.destination, NEW.ordering_key, NEW.idempotency_key,
                NEW.target, NEW.state, NEW.attempts, NEW.lease_owner,
                extract(epoch FROM NEW.lease_until), NEW.last_error, NEW.last_status);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {audit}.message_events (
            op, id, destination, ordering_key, old_state, new_state, old_attempts,
            new_attempts, old_owner, new_owner, old_lease_until, new_lease_until,
            last_error, last_status)
        VALUES ('update', NEW.id, NEW.destination, NEW.ordering_key, OLD.state, NEW.state,
                OLD.attempts, NEW.attempts, OLD.lease_owner, NEW.lease_owner,
                extract(epoch FROM OLD.lease_until), extract(epoch FROM NEW.lease_until),
                NEW.last_error, NEW.last_status);
    ELSE
        INSERT INTO {audit}.message_events (
            op, id, destination, ordering_key, old_state, old_attempts, old_owner,
            old_lease_until, last_error, last_status)
        VALUES ('delete', OLD.id, OLD.destination, OLD.ordering_key, OLD.state, OLD.attempts,
                OLD.lease_owner, extract(epoch FROM OLD.lease_until), OLD.last_error,
                OLD.last_status);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER history_message_events
AFTER INSERT OR UPDATE OR DELETE ON {outbox}.messages
FOR EACH ROW EXECUTE FUNCTION {audit}.message_event();

CREATE TABLE {audit}.health_events (
    seq                bigserial PRIMARY KEY,
    at                 double precision NOT NULL DEFAULT extract(epoch FROM clock_timestamp()),
    txn_start          double precision NOT NULL DEFAULT extract(epoch FROM now()),
    xid                bigint NOT NULL DEFAULT CAST(CAST(pg_current_xact_id() AS text) AS bigint),
    app                text NOT NULL DEFAULT current_setting('application_name'),
    op                 text NOT NULL,
    destination        text NOT NULL,
    old_state          text,
    new_state          text,
    old_blocked_until  double precision,
    new_blocked_until  double precision,
    probe_owner        text,
    failed_probes      integer
);

CREATE FUNCTION {audit}.health_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {audit}.health_events (
            op, destination, new_state, new_blocked_until, probe_owner, failed_probes)
        VALUES ('insert', NEW.destination, NEW.state, extract(epoch FROM NEW.blocked_until),
                NEW.probe_owner, NEW.failed_probes);
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {audit}.health_events (
            op, destination, old_state, new_state, old_blocked_until, new_blocked_until,
            probe_owner, failed_probes)
        VALUES ('update', NEW.destination, OLD.state, NEW.state,
                extract(epoch FROM OLD.blocked_until), extract(epoch FROM NEW.blocked_until),
                NEW.probe_owner, NEW.failed_probes);
    ELSE
        INSERT INTO {audit}.health_events (
            op, destination, old_state, old_blocked_until, probe_owner, failed_probes)
        VALUES ('delete', OLD.destination, OLD.state, extract(epoch FROM OLD.blocked_until),
                OLD.probe_owner, OLD.failed_probes);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER history_health_events
AFTER INSERT OR UPDATE OR DELETE ON {outbox}.destination_health
FOR EACH ROW EXECUTE FUNCTION {audit}.health_event();

CREATE TABLE {audit}.slot_events (
    seq          bigserial PRIMARY KEY,
    at           double precision NOT NULL DEFAULT extract(epoch FROM clock_timestamp()),
    xid          bigint NOT NULL DEFAULT CAST(CAST(pg_current_xact_id() AS text) AS bigint),
    app          text NOT NULL DEFAULT current_setting('application_name'),
    op           text NOT NULL,
    destination  text NOT NULL,
    slot         integer NOT NULL,
    old_holder   bigint,
    new_holder   bigint
);

CREATE FUNCTION {audit}.slot_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {audit}.slot_events (op, destination, slot, new_holder)
        VALUES ('insert', NEW.destination, NEW.slot, NEW.message_id);
    ELSIF TG_OP = 'UPDATE' THEN
        IF OLD.message_id IS DISTINCT FROM NEW.message_id THEN
            INSERT INTO {audit}.slot_events (op, destination, slot, old_holder, new_holder)
            VALUES ('update', NEW.destination, NEW.slot, OLD.message_id, NEW.message_id);
        END IF;
    ELSE
        INSERT INTO {audit}.slot_events (op, destination, slot, old_holder)
        VALUES ('delete', OLD.destination, OLD.slot, OLD.message_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER history_slot_events
AFTER INSERT OR UPDATE OR DELETE ON {outbox}.destination_slots
FOR EACH ROW EXECUTE FUNCTION {audit}.slot_event();
"""


_UNSEATED = """
CREATE FUNCTION {audit}.unseated_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {audit}.slot_events (op, destination, slot, new_holder)
        VALUES ('listed', NEW.destination, 0, NEW.message_id);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO {audit}.slot_events (op, destination, slot, old_holder)
        VALUES ('delisted', OLD.destination, 0, OLD.message_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER history_unseated_events
AFTER INSERT OR DELETE ON {outbox}.unseated_requests
FOR EACH ROW EXECUTE FUNCTION {audit}.unseated_event();
"""
"""Where the schema has ``unseated_requests`` (requests in flight that wait for a
concurrency slot, migration 0021), its changes go to ``slot_events`` as slot 0:
``listed`` and ``delisted``, with the request as holder."""


def install(url: str, *, schema: str = "outbox") -> None:
    """Create the record's schema, tables and triggers in the database at ``url``
    (migrated to ``schema``), in one transaction."""
    names = {"audit": sql.Identifier(AUDIT).as_string(), "outbox": _quoted(schema)}
    with psycopg.connect(url, application_name="history-harness") as conn:
        conn.execute(_DDL.format(**names).encode())
        row = conn.execute(
            "SELECT to_regclass(%s)", (f"{_quoted(schema)}.unseated_requests",)
        ).fetchone()
        if row is not None and row[0] is not None:
            conn.execute(_UNSEATED.format(**names).encode())


def _quoted(name: str) -> str:
    return sql.Identifier(name).as_string()


def read(conn: psycopg.Connection[Any], table: str) -> list[dict[str, Any]]:
    """Every row of one of the record's tables, in the order written."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(sql.SQL("SELECT * FROM {} ORDER BY seq").format(sql.Identifier(AUDIT, table)))
    return list(cur.fetchall())
