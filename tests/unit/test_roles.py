"""The statements of ``outbox roles``, built without a database."""

from __future__ import annotations

import pytest

from outbox.errors import ConfigurationError
from outbox.roles import grants
from tests.errors import invalid_argument


def test_each_role_starts_from_nothing_then_gets_its_needs() -> None:
    statements = grants("box", producer="app")

    assert statements[:3] == [
        'REVOKE ALL ON ALL TABLES IN SCHEMA "box" FROM "app"',
        'REVOKE ALL ON ALL SEQUENCES IN SCHEMA "box" FROM "app"',
        'GRANT USAGE ON SCHEMA "box" TO "app"',
    ]
    assert 'GRANT USAGE ON SEQUENCE "box"."messages_id_seq" TO "app"' in statements
    assert 'GRANT SELECT ("id") ON TABLE "box"."messages" TO "app"' in statements


def test_the_producer_is_granted_nothing_on_secrets_and_no_update_of_messages() -> None:
    statements = grants("outbox", producer="app")
    assert not [s for s in statements if "endpoint_secrets" in s]
    assert not [s for s in statements if "UPDATE" in s or "DELETE" in s]


def test_the_dispatcher_updates_only_the_health_columns_of_endpoints() -> None:
    on_endpoints = [s for s in grants("outbox", dispatcher="d") if '"endpoints"' in s]
    assert on_endpoints == [
        'GRANT SELECT ON TABLE "outbox"."endpoints" TO "d"',
        'GRANT UPDATE ("enabled", "disabled_reason", "disabled_at", "failure_streak",'
        ' "failing_since", "last_success_at", "updated_at") ON TABLE "outbox"."endpoints"'
        ' TO "d"',
    ]
    on_secrets = [s for s in grants("outbox", dispatcher="d") if "endpoint_secrets" in s]
    assert on_secrets == ['GRANT SELECT ON TABLE "outbox"."endpoint_secrets" TO "d"']


def test_the_producer_records_events_and_the_dispatcher_only_prunes_them() -> None:
    statements = grants("outbox", producer="p", dispatcher="d")
    assert [s for s in statements if '"events"' in s] == [
        'GRANT SELECT, INSERT ON TABLE "outbox"."events" TO "p"',
        'GRANT SELECT, DELETE ON TABLE "outbox"."events" TO "d"',
        # retention locks the rows it removes: FOR UPDATE needs UPDATE on a column
        'GRANT UPDATE ("created_at") ON TABLE "outbox"."events" TO "d"',
    ]


def test_operators_write_event_types_settings_and_the_dispatcher_only_reads_them() -> None:
    statements = grants("outbox", producer="p", dispatcher="d", operator="o")
    assert [s for s in statements if '"event_types"' in s] == [
        'GRANT SELECT ON TABLE "outbox"."event_types" TO "d"',
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "outbox"."event_types" TO "o"',
    ]


def test_role_names_are_quoted_as_identifiers() -> None:
    statements = grants("outbox", operator='ops"; DROP TABLE x; --')
    assert statements[0] == (
        'REVOKE ALL ON ALL TABLES IN SCHEMA "outbox" FROM "ops""; DROP TABLE x; --"'
    )


def test_no_role_no_statement_and_one_role_for_two_uses_is_refused() -> None:
    assert grants("outbox") == []
    with invalid_argument("operator"):
        grants("outbox", producer="app", operator="app")
    with pytest.raises(ConfigurationError, match="schema"):
        grants("bad-name", producer="app")


def test_the_dispatcher_writes_destination_health_and_the_producer_never_sees_it() -> None:
    statements = grants("outbox", producer="p", dispatcher="d")
    assert [s for s in statements if "destination_health" in s] == [
        'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "outbox"."destination_health" TO "d"'
    ]
