"""Schema migrations, the ``outbox migrate`` command, packaging and the embedded server."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import zipfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dispatchers.embedded import EmbeddedPostgres
from dispatchers.store.statements import store_queries, web_queries
from outbox import ConfigurationError, MigrationError, Outbox, migrate
from outbox._message import url_origin
from outbox._queries import lock_object_id, queries_for
from outbox.endpoints import Endpoints, Secret
from outbox.migrations import Migration, _lock_key, applied_versions, load_migrations

REPO = Path(__file__).resolve().parents[2]
TABLES = {
    "messages",
    "delivered",
    "message_keys",
    "attempts",
    "endpoints",
    "endpoint_secrets",
    "events",
    "destination_policies",
    "destination_slots",
    "rate_slots",
    "unseated_requests",
    "event_types",
    "destination_health",
    "tenants",
    "expunges",
    "portal_links",
    "alert_conditions",
    "retention_rules",
    "schema_migrations",
    "api_tokens",
    "audit_log",
    "message_keys_old",
    "events_old",
    "key_generation",
    "api_cursor_key",
}
MIGRATIONS = load_migrations()
NAMES = [f"{m.version:04d}_{m.name}" for m in MIGRATIONS]
VERSIONS = [m.version for m in MIGRATIONS]


def connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(url, autocommit=True)


def tables(url: str, schema: str) -> set[str]:
    """The tables of ``schema``; a partition is a part of its table (delivered and
    attempts, migration 0032), not one of them."""
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT c.relname FROM pg_class AS c"
            " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition",
            (schema,),
        ).fetchall()
    return {r[0] for r in rows}


def recorded(url: str, schema: str = "outbox") -> list[tuple[int, str, str]]:
    with connect(url) as conn:
        rows = conn.execute(
            sql.SQL("SELECT version, name, checksum FROM {}.schema_migrations ORDER BY 1").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def enqueue_as_before_digests(conn: psycopg.Connection[Any], url: str, key: str) -> int:
    """Write a message and its key as ``enqueue`` did before migration 0007 gave
    keys their request's digest (and 0009 messages their destination): for
    databases migrated only that far."""
    row = conn.execute(
        "WITH new_key AS ("
        " INSERT INTO outbox.message_keys (target, idempotency_key, message_id)"
        " VALUES (%(url)s, %(key)s, nextval('outbox.messages_id_seq')) RETURNING message_id)"
        " INSERT INTO outbox.messages (id, idempotency_key, target, url, method, headers,"
        " body, content_type, state, max_attempts)"
        " SELECT message_id, %(key)s, %(url)s, %(url)s, 'POST', '{}', '{}',"
        " 'application/json', 'ready', 5 FROM new_key RETURNING id",
        {"url": url, "key": key},
    ).fetchone()
    assert row is not None
    return int(row[0])


def outbox_command() -> list[str]:
    """The installed ``outbox`` console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "outbox"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "dispatchers.cli"]


# -- the runner ----------------------------------------------------------------------


def test_migrate_creates_the_schema_on_an_empty_database(empty_database_url: str) -> None:
    applied = migrate(empty_database_url)

    expected = load_migrations()
    assert [(m.version, m.name) for m in applied] == [(m.version, m.name) for m in expected]
    assert applied[0] == Migration(
        1, "initial", (REPO / "sql" / "migrations" / "0001_initial.sql").read_text("utf-8")
    )
    assert tables(empty_database_url, "outbox") == TABLES
    assert recorded(empty_database_url) == [(m.version, m.name, m.checksum) for m in expected]
    assert applied_versions(empty_database_url) == [m.version for m in expected]

    with connect(empty_database_url) as conn:
        indexes = dict(
            conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes"
                " WHERE schemaname = 'outbox' AND tablename = 'messages'"
            ).fetchall()
        )
    assert "WHERE ((state)::text = 'ready'::text)" in indexes["messages_claimable_idx"]
    assert "(destination, available_at, id)" in indexes["messages_claimable_idx"]
    assert "WHERE ((state)::text = 'running'::text)" in indexes["messages_lease_idx"]
    assert "(lease_until)" in indexes["messages_lease_idx"]


def test_second_migrate_applies_nothing(empty_database_url: str) -> None:
    first = migrate(empty_database_url)
    with connect(empty_database_url) as conn:
        before = conn.execute("SELECT * FROM outbox.schema_migrations ORDER BY 1").fetchall()

    assert first != []
    assert migrate(empty_database_url) == []

    with connect(empty_database_url) as conn:
        after = conn.execute("SELECT * FROM outbox.schema_migrations ORDER BY 1").fetchall()
    assert after == before


def test_applied_versions_of_a_database_never_migrated_is_empty(empty_database_url: str) -> None:
    assert applied_versions(empty_database_url) == []


@pytest.mark.slow
def test_concurrent_migrate_commands_both_succeed_and_apply_once(empty_database_url: str) -> None:
    command = [*outbox_command(), "migrate", "--database-url", empty_database_url, "--json"]
    procs: list[subprocess.Popen[str]] = []
    try:
        with (
            connect(empty_database_url) as holder,
            connect(empty_database_url) as watcher,  # pg_stat_activity is per-transaction
            holder.transaction(),
        ):
            # Hold the migration lock so that both commands are certainly waiting at once.
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("outbox"),))
            procs = [
                subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)
            ]
            deadline = time.monotonic() + 30
            while watcher.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event = 'advisory'"
            ).fetchone() != (2,):
                assert [p.poll() for p in procs] == [None, None], "a command exited early"
                assert time.monotonic() < deadline, "the commands never waited for the lock"
                time.sleep(0.02)
        # The lock is released: both go ahead, one after the other.
        results = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()

    assert [p.returncode for p in procs] == [0, 0], results
    # Each migration is its own transaction under the lock, so the two may take
    # turns; between them every migration is applied exactly once, in order.
    outputs = [json.loads(out)["applied"] for out, _ in results]
    assert sorted(outputs[0] + outputs[1]) == NAMES
    assert all(applied == sorted(applied) for applied in outputs)
    assert [v for v, _, _ in recorded(empty_database_url)] == VERSIONS


def test_custom_schema_is_migrated_and_used_by_outbox(empty_database_url: str) -> None:
    applied = migrate(empty_database_url, schema="custom_box")

    assert [m.version for m in applied] == VERSIONS
    assert tables(empty_database_url, "custom_box") == TABLES
    assert tables(empty_database_url, "outbox") == set()
    assert applied_versions(empty_database_url, schema="custom_box") == VERSIONS
    assert applied_versions(empty_database_url) == []

    box = Outbox(schema="custom_box")
    assert box.queries.channel == "custom_box_ready"
    with psycopg.connect(empty_database_url) as conn:
        message_id = box.enqueue(
            conn, url="https://example.com/", idempotency_key="k", json={"x": 1}
        )
        conn.commit()
    with connect(empty_database_url) as conn:
        rows = conn.execute("SELECT id, body FROM custom_box.messages").fetchall()
        keys = conn.execute("SELECT message_id FROM custom_box.message_keys").fetchall()
    assert rows == [(message_id, b'{"x":1}')]
    assert keys == [(message_id,)]


def test_dropping_the_key_index_keeps_existing_keys_deduping(empty_database_url: str) -> None:
    # a database at 0003 with a pending message and a delivered one, each with its key
    migrate(empty_database_url, migrations=MIGRATIONS[:3])
    box = Outbox()
    with psycopg.connect(empty_database_url) as conn:
        pending = enqueue_as_before_digests(conn, "https://example.com/a", "p")
        done = enqueue_as_before_digests(conn, "https://example.com/a", "d")
        conn.execute(
            "WITH moved AS (DELETE FROM outbox.messages WHERE id = %s RETURNING *)"
            " INSERT INTO outbox.delivered (id, idempotency_key, target, url, method, headers,"
            " body, content_type, attempts, max_attempts, created_at, completed_at)"
            " SELECT id, idempotency_key, target, url, method, headers, body, content_type,"
            " 1, max_attempts, created_at, now() FROM moved",
            (done,),
        )

    applied = migrate(empty_database_url)

    assert [m.name for m in applied] == [m.name for m in MIGRATIONS[3:]]
    with connect(empty_database_url) as conn:
        indexes = conn.execute(
            "SELECT indexname FROM pg_indexes"
            " WHERE schemaname = 'outbox' AND tablename = 'message_keys'"
        ).fetchall()
        assert indexes == [("message_keys_pkey",)]
        with conn.transaction():
            assert (
                box.enqueue(conn, url="https://example.com/a", idempotency_key="p", json={})
                == pending
            )
            assert (
                box.enqueue(conn, url="https://example.com/a", idempotency_key="d", json={}) == done
            )
        keys = conn.execute(
            "SELECT idempotency_key, message_id FROM outbox.message_keys ORDER BY 1"
        ).fetchall()
        messages = conn.execute("SELECT id FROM outbox.messages").fetchall()
    assert keys == [("d", done), ("p", pending)]
    assert messages == [(pending,)]


@pytest.mark.parametrize(
    "schema",
    ["", "1box", "out-box", "out box", 'x"; DROP TABLE t; --', "a" * 49, "bo\u00eete", "a.b"],
)
def test_bad_schema_name_raises_configuration_error(empty_database_url: str, schema: str) -> None:
    with pytest.raises(ConfigurationError, match="schema"):
        migrate(empty_database_url, schema=schema)
    with pytest.raises(ConfigurationError, match="schema"):
        Outbox(schema=schema)
    with pytest.raises(ConfigurationError, match="schema"):
        applied_versions(empty_database_url, schema=schema)
    with connect(empty_database_url) as conn:
        created = conn.execute(
            "SELECT nspname FROM pg_namespace"
            " WHERE nspname NOT LIKE 'pg\\_%' AND nspname NOT IN ('public', 'information_schema')"
        ).fetchall()
    assert created == []


def test_longest_valid_schema_name_is_accepted(empty_database_url: str) -> None:
    schema = "s" * 48
    assert [m.version for m in migrate(empty_database_url, schema=schema)] == VERSIONS
    assert Outbox(schema=schema).queries.channel == schema + "_ready"


def test_migration_changed_after_it_was_applied_raises_migration_error(
    empty_database_url: str,
) -> None:
    original = load_migrations()
    migrate(empty_database_url, migrations=original)
    changed = [
        Migration(m.version, m.name, m.sql + "\nCREATE TABLE sneaky (id int);\n") for m in original
    ]

    with pytest.raises(MigrationError, match="0001_initial was changed after it was applied"):
        migrate(empty_database_url, migrations=changed)
    assert "sneaky" not in tables(empty_database_url, "outbox")
    assert recorded(empty_database_url) == [(m.version, m.name, m.checksum) for m in original]


def test_failing_migration_is_rolled_back_and_not_recorded(empty_database_url: str) -> None:
    version = len(MIGRATIONS) + 1
    broken = Migration(version, "broken", "CREATE TABLE half_done (id int);\nSELECT 1 / 0;\n")

    with pytest.raises(MigrationError, match=f"{version:04d}_broken failed"):
        migrate(empty_database_url, migrations=[*MIGRATIONS, broken])

    assert [v for v, _, _ in recorded(empty_database_url)] == VERSIONS
    assert "half_done" not in tables(empty_database_url, "outbox")


def test_migration_files_are_numbered_without_gaps(tmp_path: Path) -> None:
    for name in ("0001_initial.sql", "0003_later.sql"):
        (tmp_path / name).write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="0003 follows 0001"):
        load_migrations(tmp_path)
    (tmp_path / "0003_later.sql").unlink()
    (tmp_path / "2_bad-name.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"2_bad-name\.sql"):
        load_migrations(tmp_path)


CATALOG = {
    "columns": """
        SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull, a.attidentity, a.attgenerated, pg_get_expr(d.adbin, d.adrelid)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %(schema)s AND c.relkind IN ('r', 'p', 'v', 'm')
          AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relname <> 'schema_migrations'
        ORDER BY 1, 2
    """,
    "constraints": """
        SELECT c.relname, con.conname, con.contype, pg_get_constraintdef(con.oid)
        FROM pg_constraint con
        JOIN pg_class c ON c.oid = con.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relname <> 'schema_migrations'
        ORDER BY 1, 2
    """,
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = %(schema)s AND tablename <> 'schema_migrations'
        ORDER BY 1, 2
    """,
    "sequences": """
        SELECT sequencename, data_type::text, start_value, increment_by, cycle
        FROM pg_sequences WHERE schemaname = %(schema)s
        ORDER BY 1
    """,
    "other_objects": """
        SELECT c.relname, c.relkind FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND c.relname <> 'schema_migrations'
          AND c.relname NOT LIKE 'schema_migrations%%'
        ORDER BY 1
    """,
    "domains": """
        SELECT t.typname, format_type(t.typbasetype, t.typtypmod), t.typnotnull,
               con.conname, pg_get_constraintdef(con.oid), con.convalidated
        FROM pg_type t
        JOIN pg_namespace n ON n.oid = t.typnamespace
        LEFT JOIN pg_constraint con ON con.contypid = t.oid
        WHERE n.nspname = %(schema)s AND t.typtype = 'd'
        ORDER BY 1, 4
    """,
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prosrc
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %(schema)s ORDER BY 1, 2
    """,
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
        FROM pg_trigger t
        JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %(schema)s AND NOT t.tgisinternal
        ORDER BY 1, 2
    """,
}


def catalog(
    conn: psycopg.Connection[tuple[Any, ...]], schema: str
) -> dict[str, list[tuple[Any, ...]]]:
    """What ``schema`` contains, with its own name replaced by SCHEMA, and the
    constants migration 0022 makes of it (the library's, for that name) by names."""
    # a name before a dot, not the text of a string ('outbox.' is the prefix of
    # the outbox's own event types, in the triggers of migration 0028)
    own_name = re.compile(rf'(?<![\w"\'])"?{re.escape(schema)}"?\.')
    constants = {
        f" {lock_object_id(schema)}, ": " WAKE_OBJECT, ",
        f"'{schema}_ready'": "'SCHEMA_ready'",
        f"""hashtext('"{schema}"')""": """hashtext('"SCHEMA"')""",
    }

    def normalise(part: str, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        for made, name in constants.items():
            value = value.replace(made, name)
        # a function's source names no schema (each runs in a search path of
        # its own), but may hold the text "outbox." (the digests' tags)
        return value if part == "functions" else own_name.sub("SCHEMA.", value)

    return {
        part: [
            tuple(normalise(part, v) for v in row)
            for row in conn.execute(query, {"schema": schema}).fetchall()
        ]
        for part, query in CATALOG.items()
    }


def test_migrated_schema_equals_what_the_migration_files_describe(
    empty_database_url: str,
) -> None:
    migrate(empty_database_url, schema="by_runner")
    with connect(empty_database_url) as conn:
        conn.execute("CREATE SCHEMA by_hand")
        conn.execute("SET search_path TO by_hand")
        files = sorted((REPO / "sql" / "migrations").glob("*.sql"))
        assert [f.name for f in files][:1] == ["0001_initial.sql"]
        for path in files:
            conn.execute(path.read_bytes())
        conn.execute("SET search_path TO public")

        by_runner = catalog(conn, "by_runner")
        by_hand = catalog(conn, "by_hand")
        parts = {
            name for (name,) in conn.execute("SELECT partition FROM by_runner.history_partitions()")
        }

    assert {"delivered_default", "attempts_default"} <= parts
    assert {t for t, *_ in by_runner["columns"]} - parts == TABLES - {"schema_migrations"}
    assert ("messages", "messages_claimable_idx") in {i[:2] for i in by_runner["indexes"]}
    assert any("REFERENCES SCHEMA.endpoints(id)" in c[3] for c in by_runner["constraints"])
    assert ("message_state", "text") in {d[:2] for d in by_runner["domains"]}
    for part in CATALOG:
        assert by_runner[part] == by_hand[part], part


# A value each single-column rule refuses: (table, column, value).
REFUSED = [
    ("messages", "state", "delivered"),
    ("messages", "attempts", -1),
    ("messages", "max_attempts", 0),
    ("messages", "retry_base", -1),
    ("attempts", "attempt", 0),
    ("endpoints", "failure_streak", -1),
    ("endpoints", "max_concurrency", 0),
    ("endpoints", "rate_limit_per_s", 0.0),
    ("destination_slots", "slot", 0),  # 0014 moved the endpoint_slots rows there
]


def test_upgrading_rows_to_domains_keeps_them_and_equals_a_fresh_schema(
    empty_database_url: str,
) -> None:
    # a database at 0004 with a row in every table that 0005 changes
    before = MIGRATIONS[:4]
    migrate(empty_database_url, migrations=before)
    with psycopg.connect(empty_database_url) as conn:
        endpoint = conn.execute(
            "INSERT INTO outbox.endpoints (url, max_concurrency, rate_limit_per_s)"
            " VALUES ('https://example.com/hooks', 2, 5.0) RETURNING id"
        ).fetchone()
        assert endpoint
        conn.execute(
            "INSERT INTO outbox.endpoint_slots (endpoint_id, slot) VALUES (%s, 1), (%s, 2)",
            (endpoint[0], endpoint[0]),
        )
        message = enqueue_as_before_digests(conn, "https://example.com/a", "p")
        conn.execute(
            "UPDATE outbox.messages SET state = 'dead', attempts = 3, retry_base = 1 WHERE id = %s",
            (message,),
        )
        conn.execute(
            "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)"
            " VALUES (%s, 3, 'o', now(), 'failed')",
            (message,),
        )
    with connect(empty_database_url) as conn:
        rows = {
            t: conn.execute(f"SELECT * FROM outbox.{t} ORDER BY 1, 2").fetchall()
            for t in ("messages", "attempts", "endpoints", "endpoint_slots")
        }

    # up to 0005 only: 0006 moves the secrets out of the endpoints rows kept here
    applied = migrate(empty_database_url, migrations=MIGRATIONS[:5])
    migrate(empty_database_url, schema="fresh", migrations=MIGRATIONS[:5])

    assert [m.version for m in applied] == [5]
    with connect(empty_database_url) as conn:
        for table, kept in rows.items():
            assert conn.execute(f"SELECT * FROM outbox.{table} ORDER BY 1, 2").fetchall() == kept
        upgraded, fresh = catalog(conn, "outbox"), catalog(conn, "fresh")
    assert "messages_state_check" not in {c[1] for c in upgraded["constraints"]}
    for part in CATALOG:
        assert upgraded[part] == fresh[part], part


@pytest.mark.parametrize(("table", "column", "value"), REFUSED)
def test_upgraded_schema_still_refuses_a_value_outside_each_rule(
    empty_database_url: str, table: str, column: str, value: object
) -> None:
    migrate(empty_database_url, migrations=MIGRATIONS[:4])
    with psycopg.connect(empty_database_url) as conn:
        endpoint = conn.execute(
            "INSERT INTO outbox.endpoints (url) VALUES ('https://example.com/hooks') RETURNING id"
        ).fetchone()
        assert endpoint
        conn.execute(
            "INSERT INTO outbox.endpoint_slots (endpoint_id, slot) VALUES (%s, 1)", endpoint
        )
        message = enqueue_as_before_digests(conn, "https://example.com/a", "p")
        conn.execute(
            "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)"
            " VALUES (%s, 1, 'o', now(), 'failed')",
            (message,),
        )
    migrate(empty_database_url)

    with connect(empty_database_url) as conn:
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            conn.execute(
                sql.SQL("UPDATE outbox.{} SET {} = %s").format(
                    sql.Identifier(table), sql.Identifier(column)
                ),
                (value,),
            )
        assert refused.value.sqlstate == "23514"


@pytest.mark.slow
def test_moving_secrets_to_their_own_table_keeps_endpoints_signing_as_before(
    empty_database_url: str,
) -> None:
    # a database at 0005: one endpoint mid-rotation, one with a single secret, one without
    migrate(empty_database_url, migrations=MIGRATIONS[:5])
    new, old, only = (f"whsec_{c * 32}" for c in "ABC")
    expiry = "2999-01-01T00:00:00+00:00"
    rotating = [{"secret": new, "expires_at": None}, {"secret": old, "expires_at": expiry}]
    with psycopg.connect(empty_database_url) as conn:
        ids = [
            row[0]
            for secrets in (rotating, [{"secret": only, "expires_at": None}], [])
            for row in conn.execute(
                "INSERT INTO outbox.endpoints (url, secrets) VALUES ('https://example.com/', %s)"
                " RETURNING id",
                (json.dumps(secrets),),
            )
        ]

    applied = migrate(empty_database_url)
    migrate(empty_database_url, schema="fresh")

    assert [m.name for m in applied] == [m.name for m in MIGRATIONS[5:]]
    endpoints = Endpoints()
    with psycopg.connect(empty_database_url) as conn:
        found = [endpoints.require(conn, i).secrets for i in ids]
        upgraded, fresh = catalog(conn, "outbox"), catalog(conn, "fresh")
    assert found == [
        [Secret(new), Secret(old, datetime.fromisoformat(expiry))],
        [Secret(only)],
        [],
    ]
    assert "secrets" not in {
        column for table, _, column, *_ in upgraded["columns"] if table == "endpoints"
    }
    for part in CATALOG:
        assert upgraded[part] == fresh[part], part


@pytest.mark.slow
def test_keys_written_before_digests_still_dedupe_any_request_and_event(
    empty_database_url: str,
) -> None:
    # a database at 0006: a pending message, and an event published to one endpoint
    migrate(empty_database_url, migrations=MIGRATIONS[:6])
    with psycopg.connect(empty_database_url) as conn:
        pending = enqueue_as_before_digests(conn, "https://example.com/a", "p")
        endpoint = conn.execute(
            "INSERT INTO outbox.endpoints (url) VALUES ('https://example.com/hooks') RETURNING id"
        ).fetchone()
        assert endpoint is not None
        first_id = int(endpoint[0])
        webhook = conn.execute(
            "WITH new_key AS ("
            " INSERT INTO outbox.message_keys (target, idempotency_key, message_id)"
            " VALUES (%(target)s, %(key)s, nextval('outbox.messages_id_seq'))"
            " RETURNING message_id)"
            " INSERT INTO outbox.messages (id, idempotency_key, target, endpoint_id, method,"
            " headers, body, content_type, event_type, state, max_attempts)"
            " SELECT message_id, %(key)s, %(target)s, %(endpoint)s, 'POST', '{}', '{}',"
            " 'application/json', 'order.paid', 'ready', 8 FROM new_key RETURNING id",
            {"target": f"endpoint:{first_id}", "key": f"evt:{first_id}", "endpoint": first_id},
        ).fetchone()
        assert webhook is not None

    applied = migrate(empty_database_url)
    migrate(empty_database_url, schema="fresh")

    assert [m.version for m in applied] == list(range(7, len(MIGRATIONS) + 1))
    box = Outbox()
    with psycopg.connect(empty_database_url) as conn:
        # no digest was kept: the key accepts any request, as it did
        assert (
            box.enqueue(conn, url="https://example.com/a", idempotency_key="p", body="new")
            == pending
        )
        # the event's first message is found by its key; an endpoint added since
        # gets its own (there was no record of the event to stop it)
        second = Endpoints().add(conn, url="https://example.com/other")
        ids = box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt")
        assert ids[0] == webhook[0] and len(ids) == 2
        # and from now on the event is recorded: published once
        third = Endpoints().add(conn, url="https://example.com/third")
        assert box.publish(conn, "order.paid", {"n": 1}, idempotency_key="evt") == ids
        messages = conn.execute("SELECT endpoint_id FROM outbox.messages ORDER BY id").fetchall()
        upgraded, fresh = catalog(conn, "outbox"), catalog(conn, "fresh")
    assert messages == [(None,), (first_id,), (second.id,)]
    assert third.id not in {m[0] for m in messages}
    for part in CATALOG:
        assert upgraded[part] == fresh[part], part


@pytest.mark.slow
def test_destinations_of_existing_messages_are_the_ones_enqueue_computes(
    empty_database_url: str,
) -> None:
    # a database at 0008 with plain messages in several spellings and a webhook
    migrate(empty_database_url, migrations=MIGRATIONS[:8])
    urls = [
        "https://example.com/a",
        "HTTPS://Example.COM:443/b?x=1",
        "http://example.com:/c",
        "http://example.com:08080/d",
        "http://[2001:DB8::1]/e",
        "https://[::1]:8443/f",
    ]
    with psycopg.connect(empty_database_url) as conn:
        plain = [enqueue_as_before_digests(conn, url, f"k{i}") for i, url in enumerate(urls)]
        endpoint = conn.execute(
            "INSERT INTO outbox.endpoints (url) VALUES ('https://example.com/') RETURNING id"
        ).fetchone()
        assert endpoint
        conn.execute(
            "INSERT INTO outbox.messages (idempotency_key, target, endpoint_id, body,"
            " content_type, max_attempts) VALUES ('w', %s, %s, '{}', 'application/json', 8)",
            (f"endpoint:{endpoint[0]}", endpoint[0]),
        )

    migrate(empty_database_url)
    migrate(empty_database_url, schema="fresh")

    with connect(empty_database_url) as conn:
        found = dict(conn.execute("SELECT idempotency_key, destination FROM outbox.messages"))
        upgraded, fresh = catalog(conn, "outbox"), catalog(conn, "fresh")
    assert len(plain) == len(urls)
    assert found == {
        **{f"k{i}": url_origin(url) for i, url in enumerate(urls)},
        "w": f"endpoint:{endpoint[0]}",
    }
    for part in CATALOG:
        assert upgraded[part] == fresh[part], part


def test_attempts_recorded_as_succeeded_read_delivered_after_the_upgrade(
    empty_database_url: str,
) -> None:
    # a database at 0009, where delivered attempts were recorded as 'succeeded'
    migrate(empty_database_url, migrations=MIGRATIONS[:9])
    with psycopg.connect(empty_database_url) as conn:
        conn.execute(
            "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)"
            " VALUES (1, 1, 'd', now(), 'retry'), (1, 2, 'd', now(), 'succeeded'),"
            " (2, 1, 'd', now(), 'failed')"
        )

    applied = migrate(empty_database_url)

    assert [m.version for m in applied] == list(range(10, len(MIGRATIONS) + 1))
    with psycopg.connect(empty_database_url) as conn:
        outcomes = conn.execute(
            "SELECT message_id, attempt, outcome FROM outbox.attempts ORDER BY 1, 2"
        ).fetchall()
    assert outcomes == [(1, 1, "retry"), (1, 2, "delivered"), (2, 1, "failed")]


# -- the command ---------------------------------------------------------------------


@pytest.mark.slow
def test_endpoints_slots_move_to_destination_slots_and_their_rate_limits_get_rate_slots(
    empty_database_url: str,
) -> None:
    # a database at 0013: a capped endpoint with a rate limit (stored, not yet
    # enforced), its slots, one held by a running message, one ready message
    migrate(empty_database_url, migrations=MIGRATIONS[:13])
    with psycopg.connect(empty_database_url) as conn:
        limited, plain = (
            row[0]
            for bounds in ((2, 2.5), (None, None))
            for row in conn.execute(
                "INSERT INTO outbox.endpoints (url, max_concurrency, rate_limit_per_s)"
                " VALUES ('https://example.com/hooks', %s, %s) RETURNING id",
                bounds,
            )
        )
        conn.execute(
            "INSERT INTO outbox.endpoint_slots (endpoint_id, slot) VALUES (%s, 1), (%s, 2)",
            (limited, limited),
        )
        # written as that version's publish wrote them (today's reads columns
        # that later migrations add)
        running, ready = (
            row[0]
            for key in ("e1", "e2")
            for row in conn.execute(
                "INSERT INTO outbox.messages (idempotency_key, target, destination, endpoint_id,"
                " body, content_type, event_type, max_attempts)"
                " VALUES (%s, %s, %s, %s, '{}', 'application/json', 'order.created', 8)"
                " RETURNING id",
                (key, f"endpoint:{limited}", f"endpoint:{limited}", limited),
            )
        )
        conn.execute(
            "UPDATE outbox.messages SET state = 'running', attempts = 1, lease_owner = 'o',"
            " lease_until = now() + interval '30 seconds' WHERE id = %s",
            (running,),
        )
        conn.execute("UPDATE outbox.endpoint_slots SET message_id = %s WHERE slot = 1", (running,))
    with connect(empty_database_url) as conn:
        cur = conn.execute("SELECT * FROM outbox.messages ORDER BY id")
        messages = cur.fetchall()
        # the columns of 0013; later migrations may add more
        columns = ", ".join(column.name for column in cur.description or ())

    assert [m.version for m in migrate(empty_database_url)] == list(range(14, len(MIGRATIONS) + 1))
    migrate(empty_database_url, schema="fresh")

    with connect(empty_database_url) as conn:
        after = conn.execute(f"SELECT {columns} FROM outbox.messages ORDER BY id").fetchall()
        assert after == messages
        held = conn.execute(
            "SELECT destination, slot, message_id FROM outbox.destination_slots ORDER BY slot"
        ).fetchall()
        slots = conn.execute(
            "SELECT destination, slot, period, next_at <= now() FROM outbox.rate_slots"
            " ORDER BY slot"
        ).fetchall()
        endpoints = Endpoints()
        got = [endpoints.require(conn, i) for i in (limited, plain)]
        upgraded, fresh = catalog(conn, "outbox"), catalog(conn, "fresh")
    assert held == [(f"endpoint:{limited}", 1, running), (f"endpoint:{limited}", 2, None)]
    assert [(e.rate_limit_per_s, e.burst) for e in got] == [(2.5, 3), (None, None)]
    # 3 slots, each usable at once, then once every 3 / 2.5 s
    assert slots == [(f"endpoint:{limited}", i, timedelta(seconds=1.2), True) for i in (1, 2, 3)]
    assert ready != running
    for part in CATALOG:
        assert upgraded[part] == fresh[part], part


@pytest.mark.slow
def test_migrate_command_prints_json_and_is_idempotent(empty_database_url: str) -> None:
    command = [*outbox_command(), "migrate", "--database-url", empty_database_url, "--json"]

    first = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["applied"] == NAMES
    assert report["schema"] == "outbox"
    assert report["version"] == VERSIONS[-1]

    second = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert (again["applied"], again["version"]) == ([], VERSIONS[-1])
    assert tables(empty_database_url, "outbox") == TABLES


@pytest.mark.slow
def test_migrate_command_reports_a_bad_schema_and_exits_non_zero(empty_database_url: str) -> None:
    command = [*outbox_command(), "migrate", "--database-url", empty_database_url]
    result = subprocess.run(
        [*command, "--schema", "bad-name"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "schema" in result.stderr
    assert result.stdout == ""


# -- packaging -----------------------------------------------------------------------

# pip's output when the isolated build environment cannot get the build backend.
_NO_BACKEND = re.compile(
    r"No matching distribution found for hatchling|Failed to establish a new connection"
    r"|Temporary failure in name resolution|Network is unreachable|ProxyError"
    r"|Could not fetch URL|connection broken",
    re.IGNORECASE,
)


@pytest.mark.slow
def test_wheel_contains_the_sql_files_and_typing_markers(tmp_path: Path) -> None:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
        timeout=110,
        env=env,
        check=False,
    )
    if build.returncode != 0:
        output = build.stdout + build.stderr
        if _NO_BACKEND.search(output):
            pytest.skip(f"the build backend could not be fetched:\n{output[-2000:]}")
        pytest.fail(f"building the wheel failed:\n{output[-4000:]}")

    wheels = list(tmp_path.glob("pg_outbox-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
        packaged_sql = wheel.read("outbox/_sql/migrations/0001_initial.sql")
        wheel.extractall(tmp_path / "installed")
    for required in ("outbox/py.typed", "dispatchers/py.typed"):
        assert required in names
    assert packaged_sql == (REPO / "sql" / "migrations" / "0001_initial.sql").read_bytes()
    assert {n for n in names if n.startswith("outbox/_sql/")} == {
        f"outbox/_sql/{p.relative_to(REPO / 'sql').as_posix()}"
        for part in ("migrations", "queries")
        for p in (REPO / "sql" / part).rglob("*.sql")
    }
    # the runtime's statements, in its packages (the dispatcher's, the dashboard's,
    # the bench's, the demo's)
    runtime_sql = {p.relative_to(REPO).as_posix() for p in (REPO / "dispatchers").rglob("*.sql")}
    assert "dispatchers/store/sql/claim.sql" in runtime_sql
    assert runtime_sql <= names

    # Installed (a pure-Python wheel is its files), the package finds them inside itself.
    script = (
        "from outbox.migrations import load_migrations\n"
        "from outbox._queries import queries_for, sql_dir\n"
        "from dispatchers.store.statements import SQL_DIR, store_queries, web_queries\n"
        "print(sql_dir())\n"
        "print(SQL_DIR)\n"
        "print(len(load_migrations()), len(queries_for('outbox').names()),"
        " len(store_queries('outbox').names()), len(web_queries('outbox').names()))\n"
    )
    installed = tmp_path / "installed"
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PYTHONPATH": str(installed)},
        cwd=tmp_path,
        check=True,
    )
    found_dir, store_dir, counts = run.stdout.splitlines()
    assert Path(found_dir) == installed / "outbox" / "_sql"
    assert Path(store_dir) == installed / "dispatchers" / "store" / "sql"
    expected = (
        load_migrations(),
        queries_for("outbox").names(),
        store_queries("outbox").names(),
        web_queries("outbox").names(),
    )
    assert counts == " ".join(str(len(each)) for each in expected)


# -- the embedded server -------------------------------------------------------------


@pytest.mark.slow
def test_embedded_server_starts_and_is_shared_by_every_handle_on_its_path(tmp_path: Path) -> None:
    path = tmp_path / "pg"
    server = EmbeddedPostgres(path, delete=True)
    try:
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)

        assert EmbeddedPostgres(path).url == server.url

        # Another process gets the same server, and leaving does not stop it for us.
        other = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from dispatchers.embedded import EmbeddedPostgres;"
                " print(EmbeddedPostgres(sys.argv[1]).url)",
                str(path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert other.stdout.strip() == server.url
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 2").fetchone() == (2,)
    finally:
        server.cleanup()
    assert not path.exists(), "delete=True removes the data directory with the last user"


# -- import direction ----------------------------------------------------------------


def _imported_modules(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            found.add(node.args[0].value)
    return found


def test_the_library_never_imports_the_dispatchers() -> None:
    files = sorted((REPO / "outbox").rglob("*.py"))
    assert REPO / "outbox" / "_core.py" in files
    offenders = {
        str(path.relative_to(REPO)): sorted(
            m
            for m in _imported_modules(ast.parse(path.read_text("utf-8"), str(path)))
            if m == "dispatchers" or m.startswith("dispatchers.")
        )
        for path in files
    }
    assert {f: m for f, m in offenders.items() if m} == {}

    linter = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))["tool"]["importlinter"]
    contracts = [
        (c["type"], c["forbidden_modules"])
        for c in linter["contracts"]
        if c.get("source_modules") == ["outbox"]
    ]
    assert ("forbidden", ["dispatchers"]) in contracts


def test_import_scan_sees_every_form_of_import() -> None:
    source = (
        "import dispatchers\n"
        "from dispatchers.cli import main\n"
        "import importlib\n"
        "importlib.import_module('dispatchers.runtime.dispatcher')\n"
        "__import__('dispatchers.delivery.http')\n"
        "from . import sibling\n"
    )
    assert _imported_modules(ast.parse(source)) == {
        "dispatchers",
        "dispatchers.cli",
        "importlib",
        "dispatchers.runtime.dispatcher",
        "dispatchers.delivery.http",
    }
