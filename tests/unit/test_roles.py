"""The statements of ``outbox roles``, built without a database."""

from __future__ import annotations

import pytest

from outbox.errors import ConfigurationError
from outbox.roles import PRIVILEGES, ROLES, SEQUENCES, TABLES, WHOLE_TABLE, grants, holds
from tests.errors import invalid_argument


def test_each_role_starts_from_nothing_then_gets_its_needs() -> None:
    statements = grants("box", producer="app")

    assert statements[:4] == [
        'REVOKE ALL ON ALL TABLES IN SCHEMA "box" FROM "app"',
        'REVOKE ALL ON ALL SEQUENCES IN SCHEMA "box" FROM "app"',
        'REVOKE ALL ON ALL FUNCTIONS IN SCHEMA "box" FROM "app"',
        'GRANT USAGE ON SCHEMA "box" TO "app"',
    ]
    assert 'GRANT USAGE ON SEQUENCE "box"."messages_id_seq" TO "app"' in statements
    assert 'GRANT SELECT ("id") ON TABLE "box"."messages" TO "app"' in statements


def test_the_producer_executes_the_sql_producers_and_the_dispatcher_its_alerts() -> None:
    statements = grants("box", producer="p", dispatcher="d", operator="o")
    assert [s for s in statements if s.startswith("GRANT EXECUTE")] == [
        'GRANT EXECUTE ON FUNCTION "box"."enqueue", "box"."publish", "box"."key_lookup",'
        ' "box"."key_taken_before" TO "p"',
        'GRANT EXECUTE ON FUNCTION "box"."alert_lag", "box"."alert_unknown_key",'
        ' "box"."expire_payloads", "box"."history_partitions", "box"."history_extend",'
        ' "box"."history_drop", "box"."key_generation_turn", "box"."key_generation_carry"'
        ' TO "d"',
    ]


def test_the_producer_is_granted_nothing_on_secrets_and_no_update_of_messages() -> None:
    statements = grants("outbox", producer="app")
    assert not [s for s in statements if "endpoint_secrets" in s]
    assert not [s for s in statements if "UPDATE" in s or "DELETE" in s]


def test_the_dispatcher_updates_only_the_health_columns_of_endpoints() -> None:
    on_endpoints = [s for s in grants("outbox", dispatcher="d") if '"endpoints"' in s]
    assert on_endpoints == [
        # where and how to deliver (its credentials as stored), and its health: not
        # its subscriptions nor filter
        'GRANT SELECT ("id", "url", "enabled", "disabled_reason", "disabled_at",'
        ' "failure_streak", "failing_since", "last_success_at", "max_concurrency",'
        ' "rate_limit_per_s", "ca_bundle", "client_cert", "client_key", "client_key_id",'
        ' "retry_schedule", "auth", "auth_key_id") ON TABLE "outbox"."endpoints" TO "d"',
        'GRANT UPDATE ("enabled", "disabled_reason", "disabled_at", "failure_streak",'
        ' "failing_since", "last_success_at", "updated_at") ON TABLE "outbox"."endpoints"'
        ' TO "d"',
    ]
    on_secrets = [s for s in grants("outbox", dispatcher="d") if "endpoint_secrets" in s]
    assert on_secrets == [
        'GRANT SELECT ("id", "endpoint_id", "secret", "key_id", "expires_at")'
        ' ON TABLE "outbox"."endpoint_secrets" TO "d"'
    ]


def test_the_producer_records_events_and_keys_in_both_generations_and_the_dispatcher_none() -> None:
    statements = grants("outbox", producer="p", dispatcher="d")
    written = {
        "events": ('"tenant_id", "event_key", "event_type", "digest", "message_ids"'),
        "message_keys": '"target", "idempotency_key", "message_id", "digest"',
    }
    read = {
        "events": '"tenant_id", "event_key", "digest", "message_ids"',
        # the id a new key returns: a key is found by key_lookup alone (its target
        # is a plain message's URL)
        "message_keys": '"message_id"',
    }
    for current in ("events", "message_keys"):
        for table in (current, current + "_old"):
            assert [s for s in statements if f'"{table}"' in s] == [
                f'GRANT INSERT ({written[current]}) ON TABLE "outbox"."{table}" TO "p"',
                f'GRANT SELECT ({read[current]}) ON TABLE "outbox"."{table}" TO "p"',
            ]
    # the dispatcher turns the generations through functions that run as the owner
    assert [s for s in statements if '"key_generation"' in s] == [
        'GRANT SELECT ("keys") ON TABLE "outbox"."key_generation" TO "p"'
    ]


def test_operators_write_event_types_settings_and_the_dispatcher_only_reads_them() -> None:
    statements = grants("outbox", producer="p", dispatcher="d", operator="o")
    assert [s for s in statements if '"outbox"."event_types"' in s] == [
        'GRANT SELECT ("event_type", "retry_schedule") ON TABLE "outbox"."event_types" TO "d"',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "outbox"."event_types" TO "o"',
    ]


def test_role_names_are_quoted_as_identifiers() -> None:
    statements = grants("outbox", operator='ops"; DROP TABLE x; --')
    assert statements[0] == (
        'REVOKE ALL ON ALL TABLES IN SCHEMA "outbox" FROM "ops""; DROP TABLE x; --"'
    )


@pytest.mark.parametrize("name", ["app\x00", "app\udcff"])
def test_a_role_name_that_cannot_be_sent_is_refused_naming_its_kind(name: str) -> None:
    with invalid_argument("producer"):
        grants("outbox", producer=name)


def test_no_role_no_statement_and_one_role_for_two_uses_is_refused() -> None:
    assert grants("outbox") == []
    with invalid_argument("operator"):
        grants("outbox", producer="app", operator="app")
    with pytest.raises(ConfigurationError, match="schema"):
        grants("bad-name", producer="app")


def test_the_dispatcher_writes_destination_health_and_the_producer_never_sees_it() -> None:
    statements = grants("outbox", producer="p", dispatcher="d")
    assert [s for s in statements if "destination_health" in s] == [
        'GRANT DELETE ON TABLE "outbox"."destination_health" TO "d"',
        'GRANT SELECT ("destination", "state", "blocked_until", "failed_probes", "probe_owner",'
        ' "reason") ON TABLE "outbox"."destination_health" TO "d"',
        'GRANT INSERT ("destination", "state", "blocked_until", "opened_at", "reason")'
        ' ON TABLE "outbox"."destination_health" TO "d"',
        'GRANT UPDATE ("state", "blocked_until", "failed_probes", "probe_owner", "opened_at",'
        ' "reason", "updated_at") ON TABLE "outbox"."destination_health" TO "d"',
    ]


def _columns_held(kind: str, table: str) -> set[str]:
    """Every column of ``table`` that the role of ``kind`` may read or write."""
    return {
        column
        for privilege in ("SELECT", "INSERT", "UPDATE")
        for column in TABLES[table]
        if holds(kind, table, privilege, column)
    }


def test_the_producer_reads_the_subscriptions_of_endpoints_and_no_secret_material() -> None:
    assert _columns_held("producer", "endpoints") == {
        "id", "enabled", "event_types", "filter", "tenant_id",
    }  # fmt: skip
    # a tenant is found by its external id, and nothing else of it is read
    assert _columns_held("producer", "tenants") == {"id", "external_id"}
    assert _columns_held("producer", "endpoint_secrets") == set()
    assert _columns_held("producer", "messages") == set(TABLES["messages"]) - {
        # written by the dispatcher alone; enqueue names none of them
        "attempts", "retry_base", "lease_owner", "lease_until", "last_error", "last_status",
        "created_at", "completed_at", "expunged_at",
    }  # fmt: skip
    assert [c for c in TABLES["messages"] if holds("producer", "messages", "SELECT", c)] == ["id"]
    assert not holds("producer", "messages", "UPDATE")
    assert not holds("producer", "messages", "DELETE")


def test_the_dispatcher_writes_the_state_of_a_message_and_never_what_it_says() -> None:
    updated = [c for c in TABLES["messages"] if holds("dispatcher", "messages", "UPDATE", c)]
    assert updated == [
        "state", "attempts", "available_at", "lease_owner", "lease_until", "last_error",
        "last_status", "completed_at",
    ]  # fmt: skip
    assert not holds("dispatcher", "messages", "INSERT")
    written = {c for c in TABLES["endpoints"] if holds("dispatcher", "endpoints", "UPDATE", c)}
    assert written == {
        "enabled", "disabled_reason", "disabled_at", "failure_streak", "failing_since",
        "last_success_at", "updated_at",
    }  # fmt: skip
    assert not holds("dispatcher", "endpoints", "INSERT")
    assert not holds("dispatcher", "endpoints", "DELETE")
    assert not holds("dispatcher", "endpoint_secrets", "UPDATE")


def test_the_operator_holds_every_table_but_the_migrations_record_and_the_id_sequence() -> None:
    for table in TABLES:
        for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"):
            if table == "audit_log":  # only added to and read: an entry is never changed
                assert holds("operator", table, privilege) is (privilege in ("SELECT", "INSERT"))
            elif table in ("key_generation", "api_cursor_key"):  # read, never changed
                assert holds("operator", table, privilege) is (privilege == "SELECT")
            else:
                assert holds("operator", table, privilege) is (
                    table != "schema_migrations" or privilege == "SELECT"
                )
    assert holds("operator", "messages_id_seq", "USAGE")
    assert not holds("operator", "endpoints_id_seq", "USAGE")


def test_the_privileges_name_only_tables_columns_and_privileges_of_the_schema() -> None:
    for kind, tables in PRIVILEGES.items():
        assert kind in ROLES
        for table, held in tables.items():
            if table in SEQUENCES:
                assert held == {"USAGE": WHOLE_TABLE}, (kind, table)
                continue
            assert table in TABLES, (kind, table)
            for privilege, columns in held.items():
                assert privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"), (kind, table)
                if columns == WHOLE_TABLE:
                    continue
                assert privilege != "DELETE", (kind, table)  # a table's alone
                assert columns, (kind, table, privilege)
                assert len(set(columns)) == len(columns), (kind, table, privilege)
                assert set(columns) <= set(TABLES[table]), (kind, table, privilege)


def test_holds_reads_a_whole_table_grant_as_every_column_and_a_list_as_its_own() -> None:
    assert holds("dispatcher", "messages", "SELECT", "body")
    assert holds("dispatcher", "messages", "UPDATE", "state")
    assert not holds("dispatcher", "messages", "UPDATE", "body")
    assert holds("dispatcher", "messages", "UPDATE")  # on some column
    assert not holds("producer", "endpoint_secrets", "SELECT")
    assert not holds("producer", "no_such_table", "SELECT")


def test_only_the_operator_holds_portal_links() -> None:
    # a link's digest opens a tenant's pages for whoever can make one that matches
    # it: neither the application nor the dispatcher reads or writes them
    for kind in ("producer", "dispatcher"):
        assert _columns_held(kind, "portal_links") == set()
        assert not holds(kind, "portal_links", "DELETE")
    assert _columns_held("operator", "portal_links") == set(TABLES["portal_links"])
    assert holds("operator", "portal_links", "DELETE")
