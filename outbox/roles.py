"""Least-privilege roles: what each user of the outbox is granted, and nothing more.

Four roles share a schema: owner, producer, dispatcher, operator.
:data:`PRIVILEGES` is the one table of what each role holds; :func:`grants` turns
it into statements that first revoke everything, so applying them again after a
migration leaves exactly the new version's privileges. :data:`TABLES` lists every
column as of the newest migration: a migration that adds a column adds it there,
deciding who may read or write it.

The module stays whole: :data:`TABLES` and :data:`PRIVILEGES` are one account of
every column and who holds it, which the tests hold to the live schema.

Design: docs/explanation/design/roles.md
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from psycopg import sql

from outbox._queries import check_schema_name, queries_for
from outbox._storable import check_text
from outbox._transaction import Plan, run_sync
from outbox.errors import InvalidArgument

__all__ = [
    "DEFINERS",
    "EXECUTES",
    "FUNCTIONS",
    "INVOKERS",
    "PRIVILEGES",
    "ROLES",
    "SEQUENCES",
    "TABLES",
    "WHOLE_TABLE",
    "check_roles",
    "grants",
    "holds",
]

ROLES = ("producer", "dispatcher", "operator")
"""The roles :func:`grants` knows, in the order it grants them."""

WHOLE_TABLE: Final = "*"
"""A privilege on the table itself, not on a list of its columns: every column,
those a later migration adds too. DELETE and a sequence's USAGE have no other form."""

Columns = tuple[str, ...] | Literal["*"]

TABLES: Final[Mapping[str, tuple[str, ...]]] = {
    "messages": (
        "id", "idempotency_key", "target", "endpoint_id", "url", "method", "headers",
        "body", "content_type", "event_type", "ordering_key", "state", "attempts",
        "max_attempts", "available_at", "lease_owner", "lease_until", "last_error",
        "last_status", "created_at", "completed_at", "retry_base", "destination",
        "trace_context", "expunged_at",
    ),
    "delivered": (
        "id", "idempotency_key", "target", "endpoint_id", "url", "method", "headers",
        "body", "content_type", "event_type", "ordering_key", "attempts", "max_attempts",
        "last_status", "created_at", "completed_at", "expunged_at",
    ),
    "message_keys": ("target", "idempotency_key", "message_id", "created_at", "digest"),
    "attempts": (
        "message_id", "attempt", "owner", "started_at", "duration_ms", "status", "outcome",
        "error_class", "error", "response_excerpt",
    ),
    "endpoints": (
        "id", "url", "description", "event_types", "metadata", "enabled",
        "disabled_reason", "disabled_at", "failure_streak", "failing_since",
        "last_success_at", "max_concurrency", "rate_limit_per_s", "created_at",
        "updated_at", "rate_burst", "ca_bundle", "client_cert", "client_key",
        "client_key_id", "filter", "retry_schedule", "auth", "auth_key_id", "auth_scheme",
        "auth_header_names", "basic_username", "oauth2_token_url", "oauth2_client_id",
        "oauth2_scope", "oauth2_audience", "tenant_id",
    ),
    "endpoint_secrets": ("id", "endpoint_id", "secret", "expires_at", "created_at", "key_id"),
    "events": ("event_key", "event_type", "digest", "message_ids", "created_at", "tenant_id",
               "expunged_at"),
    "destination_policies": (
        "destination", "max_concurrency", "rate_limit_per_s", "rate_burst", "created_at",
        "updated_at",
    ),
    "destination_slots": ("destination", "slot", "message_id"),
    "rate_slots": ("destination", "slot", "period", "next_at"),
    "event_types": ("event_type", "retry_schedule", "created_at", "updated_at"),
    "destination_health": (
        "destination", "state", "blocked_until", "failed_probes", "probe_owner", "opened_at",
        "reason", "updated_at",
    ),
    "schema_migrations": ("version", "name", "checksum", "applied_at"),
    "unseated_requests": ("message_id", "destination"),
    "tenants": (
        "id", "external_id", "name", "metadata", "rate_limit_per_s", "rate_burst",
        "retry_schedule", "created_at", "updated_at",
    ),
    "expunges": ("id", "at", "scope", "selector", "messages", "history", "cancelled", "running"),
    "portal_links": ("id", "token_hash", "tenant_id", "expires_at", "created_at", "revoked_at"),
    "api_tokens": ("id", "name", "scope", "tenant_id", "token_sha256", "shown_prefix",
                   "created_at", "last_used_at", "revoked_at"),
    "audit_log": ("id", "at", "token_id", "token_name", "tenant_id", "action", "resource",
                  "resource_id", "before_sha256", "after_sha256", "detail"),
    "alert_conditions": ("condition", "active", "since"),
    "retention_rules": ("id", "endpoint_id", "event_type", "payload_retention_s", "erased_until",
                        "created_at", "updated_at"),
    # the previous generation of keys and of event records (0033): as the current
    "message_keys_old": ("target", "idempotency_key", "message_id", "created_at", "digest"),
    "events_old": ("event_key", "event_type", "digest", "message_ids", "created_at",
                   "tenant_id", "expunged_at"),
    "key_generation": ("one", "generation", "turned_at", "keys", "carry_after", "carry_until",
                       "carried_at"),
    "api_cursor_key": ("one", "key"),
}  # fmt: skip
"""Every column of every table of the schema, in the order of their migrations."""

SEQUENCES: Final = (
    "messages_id_seq",
    "endpoints_id_seq",
    "endpoint_secrets_id_seq",
    "tenants_id_seq",
    "expunges_id_seq",
    "portal_links_id_seq",
    "api_tokens_id_seq",
    "audit_log_id_seq",
    "retention_rules_id_seq",
)
"""Every sequence of the schema (an identity column's is used without a grant)."""

FUNCTIONS: Final = (
    "enqueue",
    "publish",
    "key_lookup",
    "key_taken_before",
    "alert_lag",
    "alert_unknown_key",
    "expire_payloads",
    "history_partitions",
    "history_extend",
    "history_drop",
    "key_generation_turn",
    "key_generation_carry",
)
"""The functions a role may be granted ``EXECUTE`` on (migrations 0022, 0028, 0029,
0032 and 0033);
the schema's other functions are theirs to call, as its owner, and no role's."""

DEFINERS: Final = frozenset({
    # what a role is granted EXECUTE on, writing what its table grants do not let it
    "enqueue", "publish", "key_lookup", "key_taken_before",
    "alert_lag", "alert_unknown_key", "expire_payloads",
    "history_extend", "history_drop", "key_generation_turn", "key_generation_carry",
    # the alerts raised by triggers, written as the owner whoever changed the row
    "alert_message_dead", "alert_endpoint_disabled", "alert_breaker",
})  # fmt: skip
"""The schema's functions that run as its owner (SECURITY DEFINER): each checks its
arguments, none takes one that widens what its caller may do (a retention under
the floor, content to write), and none may be called by a role not granted it."""

INVOKERS: Final = frozenset({
    # helpers the functions above call (no role may call them: EXECUTE is revoked
    # from PUBLIC); they run as whoever calls them, the owner
    "_alert", "_alert_endpoint", "_alert_key_part", "_alert_tenant", "_alert_time",
    "_alerts_wanted", "_check_headers", "_check_key", "_compact", "_digest_field",
    "_envelope", "_event_digest", "_fan_out", "_grants_copy", "_history_partition_add",
    "_inet_aton", "_ip_version", "_ipv4_problem", "_lock_ordering_key",
    "_producer_constants", "_refuse", "_repr", "_retention_floor", "_trace_context",
    "_url_origin", "_wake", "history_partitions",
    # what the caller's own privileges decide: whether the generation of keys turned
    # (producers), an index's predicate, and the triggers that ask what the role
    # changing a row may do (0020, 0034)
    "_keys_moved", "_takes_alerts", "endpoint_enable_check", "message_insert_check",
})  # fmt: skip
"""The schema's functions that run as their caller (SECURITY INVOKER), on purpose."""

EXECUTES: Final[Mapping[str, tuple[str, ...]]] = {
    # the SQL producers (0022), and the look-ups of a key the library makes (0034)
    "producer": ("enqueue", "publish", "key_lookup", "key_taken_before"),
    # the alerts it raises (0028): lag past --lag-alert, a secret under a key it lacks
    "dispatcher": (
        "alert_lag",
        "alert_unknown_key",
        # the erasure of payloads past their retention rules (0029), which changes
        # bodies that its table grants do not let it touch
        "expire_payloads",
        # the history's partitions (0032): listed, made ahead, dropped past the
        # retention period, as the owner (the role owns no table to do it itself)
        "history_partitions",
        "history_extend",
        "history_drop",
        # the generations of keys and event records (0033): turned when due,
        # the live messages' keys carried into the new one, as the owner
        "key_generation_turn",
        "key_generation_carry",
    ),
}
"""The functions each role may execute."""

_EVERYTHING: Final[Mapping[str, Columns]] = {
    privilege: WHOLE_TABLE for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE")
}

_PRODUCER_KEYS: Final[Mapping[str, Columns]] = {
    "INSERT": ("target", "idempotency_key", "message_id", "digest"),
    # the id a new key returns; a key is found by key_lookup (0034), so that no
    # other key, nor a plain message's URL (its target), can be read
    "SELECT": ("message_id",),
}
_PRODUCER_EVENTS: Final[Mapping[str, Columns]] = {
    "INSERT": ("tenant_id", "event_key", "event_type", "digest", "message_ids"),
    "SELECT": ("tenant_id", "event_key", "digest", "message_ids"),
}

PRIVILEGES: Final[Mapping[str, Mapping[str, Mapping[str, Columns]]]] = {
    # enqueue.sql, and nothing else: enqueue, publish and their look-ups after a
    # conflict
    "producer": {
        "messages": {
            "INSERT": (
                "id", "idempotency_key", "target", "destination", "endpoint_id", "url",
                "method", "headers", "body", "content_type", "event_type", "ordering_key",
                "state", "max_attempts", "available_at", "trace_context",
            ),
            # the id that enqueue returns (INSERT ... RETURNING id), and no other
            "SELECT": ("id",),
        },
        # the key is inserted first; after a conflict, its message and digest are
        # read; publish records each event once, and reads it when published
        # again. The previous generation's tables (0033) hold the same grants as
        # the current ones: a turn copies them from one to the next
        "message_keys": _PRODUCER_KEYS,
        "message_keys_old": _PRODUCER_KEYS,
        "events": _PRODUCER_EVENTS,
        "events_old": _PRODUCER_EVENTS,
        # under REPEATABLE READ, whether the generation of keys turned since the
        # snapshot (_keys_moved, 0033)
        "key_generation": {"SELECT": ("keys",)},
        # publish fans out to the enabled endpoints subscribed, through their
        # filters: not their URL, TLS material or anything else
        "endpoints": {"SELECT": ("id", "enabled", "event_types", "filter", "tenant_id")},
        # publish for a tenant finds it by its external id: nothing else of it
        "tenants": {"SELECT": ("id", "external_id")},
        # a message's id is taken for its key first (nextval)
        "messages_id_seq": {"USAGE": WHOLE_TABLE},
    },
    # dispatchers/store/sql: claim, renew, complete, rescue, retention, health, preflight
    "dispatcher": {
        "messages": {
            # a claim reads what it delivers, and completion moves whole rows to
            # the history (RETURNING m.*)
            "SELECT": WHOLE_TABLE,
            # state, lease and outcome: never what a message says or where it goes
            "UPDATE": (
                "state", "attempts", "available_at", "lease_owner", "lease_until",
                "last_error", "last_status", "completed_at",
            ),
            "DELETE": WHOLE_TABLE,
        },
        "delivered": {
            "INSERT": (
                "id", "idempotency_key", "target", "endpoint_id", "url", "method", "headers",
                "body", "content_type", "event_type", "ordering_key", "attempts",
                "max_attempts", "last_status", "created_at", "completed_at",
            ),
            "SELECT": ("id", "target", "idempotency_key", "completed_at"),
            # retention locks the rows it removes (FOR UPDATE needs UPDATE on a column)
            "UPDATE": ("completed_at",),
            "DELETE": WHOLE_TABLE,
        },
        "attempts": {
            "INSERT": (
                "message_id", "attempt", "owner", "started_at", "duration_ms", "status",
                "outcome", "error_class", "error", "response_excerpt",
            ),
            # which outcomes an earlier try recorded (recorded_attempts); the
            # start, which bounds retention's batches below the partitions (0032)
            "SELECT": ("message_id", "attempt", "owner", "outcome", "started_at"),
            "DELETE": WHOLE_TABLE,
        },
        "endpoints": {
            # where and how to deliver, whether to, and its health; not its
            # subscriptions, filter, description or metadata
            "SELECT": (
                "id", "url", "enabled", "disabled_reason", "disabled_at", "failure_streak",
                "failing_since", "last_success_at", "max_concurrency", "rate_limit_per_s",
                "ca_bundle", "client_cert", "client_key", "client_key_id", "retry_schedule",
                # its credentials, as stored (all it sends with is in the sealed value)
                "auth", "auth_key_id",
            ),
            # health: a completion extends or clears the failure streak, and
            # disables (enabled false) on 410 Gone or a long failure; enabling
            # again is refused by a trigger (migration 0020)
            "UPDATE": (
                "enabled", "disabled_reason", "disabled_at", "failure_streak",
                "failing_since", "last_success_at", "updated_at",
            ),
        },
        # signing: the secrets in force, newest first, with the keys that sealed them
        "endpoint_secrets": {"SELECT": ("id", "endpoint_id", "secret", "key_id", "expires_at")},
        # whether a plain destination has a policy; the claim takes (and
        # completion frees) its slots, locking them first
        "destination_policies": {"SELECT": ("destination",)},
        "destination_slots": {
            "SELECT": ("destination", "slot", "message_id"),
            "UPDATE": ("message_id",),
        },
        "rate_slots": {
            "SELECT": ("destination", "slot", "period", "next_at"),
            "UPDATE": ("next_at",),
        },
        # a slot freed passes to a request in flight that holds none, which then
        # leaves the list (locked first: FOR UPDATE needs UPDATE on a column)
        "unseated_requests": {
            "SELECT": ("message_id", "destination"),
            "UPDATE": ("destination",),
            "DELETE": WHOLE_TABLE,
        },
        # a claim reads the retry schedule of each webhook's event type
        "event_types": {"SELECT": ("event_type", "retry_schedule")},
        # breakers and holds: claims take probes, outcomes open and close them
        "destination_health": {
            "SELECT": (
                "destination", "state", "blocked_until", "failed_probes", "probe_owner",
                "reason",
            ),
            "INSERT": ("destination", "state", "blocked_until", "opened_at", "reason"),
            "UPDATE": (
                "state", "blocked_until", "failed_probes", "probe_owner", "opened_at",
                "reason", "updated_at",
            ),
            "DELETE": WHOLE_TABLE,
        },
        # the schema's version, which a dispatcher checks before it starts; on the
        # whole table, as its check asks (preflight_schema: has_table_privilege)
        "schema_migrations": {"SELECT": WHOLE_TABLE},
    },
    # admin.sql, endpoints.sql, ..., dispatchers/store/web/sql/*.sql: every row of every
    # table; not the migrations' record; the audit log is only added to and read
    "operator": {
        **{
            t: _EVERYTHING
            for t in TABLES
            if t not in ("schema_migrations", "audit_log", "key_generation", "api_cursor_key")
        },
        # which migrations are applied: outbox ui checks it before it serves
        "schema_migrations": {"SELECT": WHOLE_TABLE},
        "audit_log": {"SELECT": WHOLE_TABLE, "INSERT": WHOLE_TABLE},
        # the generations' state is the dispatchers' to change (0033)
        "key_generation": {"SELECT": WHOLE_TABLE},
        # the key the management API signs its page cursors with (0034): read, never
        # changed (a new key would refuse every cursor in use)
        "api_cursor_key": {"SELECT": WHOLE_TABLE},
        # replay of an event, and a test event, take ids for their new messages;
        # endpoints add takes its id from an identity column (no grant needed)
        "messages_id_seq": {"USAGE": WHOLE_TABLE},
    },
}  # fmt: skip
"""What each role holds: role, table (or sequence), privilege, the columns it covers."""


def holds(kind: str, table: str, privilege: str, column: str | None = None) -> bool:
    """Whether :data:`PRIVILEGES` grants the role of ``kind`` ``privilege`` on
    ``table``, on ``column`` when one is named (any column will do otherwise)."""
    columns = PRIVILEGES[kind].get(table, {}).get(privilege)
    if columns is None:
        return False
    return columns == WHOLE_TABLE or column is None or column in columns


def _grants_on(
    schema: str, role: str, table: str, held: Mapping[str, Columns]
) -> list[sql.Composed]:
    """One statement for the privileges on the whole of ``table``, and one per
    privilege granted on some of its columns."""
    kind = sql.SQL("SEQUENCE" if table in SEQUENCES else "TABLE")
    target = sql.SQL("ON {} {} TO {}").format(
        kind, sql.Identifier(schema, table), sql.Identifier(role)
    )
    whole = [privilege for privilege, columns in held.items() if columns == WHOLE_TABLE]
    statements = []
    if whole:
        privileges = sql.SQL(", ").join(map(sql.SQL, whole))
        statements.append(sql.SQL("GRANT {} {}").format(privileges, target))
    for privilege, columns in held.items():
        if columns != WHOLE_TABLE:
            names = sql.SQL(", ").join(map(sql.Identifier, columns))
            statements.append(sql.SQL("GRANT {} ({}) {}").format(sql.SQL(privilege), names, target))
    return statements


def grants(
    schema: str,
    *,
    producer: str | None = None,
    dispatcher: str | None = None,
    operator: str | None = None,
) -> list[str]:
    """The statements that give each named role exactly what it needs in ``schema``.

    Pure: nothing is read or run. Role and schema names may be any text; they are
    quoted as identifiers. The statements are built from parts (privileges and
    tables of :data:`PRIVILEGES`, and identifiers) with :mod:`psycopg.sql`, not
    written in a ``.sql`` file: their roles and tables vary with the call.
    """
    check_schema_name(schema)
    named = {"producer": producer, "dispatcher": dispatcher, "operator": operator}
    given = [(kind, role) for kind, role in named.items() if role is not None]
    for kind, role in given:
        check_text(role, kind, error=InvalidArgument)  # a NUL cannot be sent, quoted or not
    for i, (kind, role) in enumerate(given):
        for other, same in given[:i]:
            if same == role:
                raise InvalidArgument(kind, f"{role!r} is the {other} too: give each its own role")
    statements: list[sql.Composable] = []
    for kind, role in given:
        parts = {"schema": sql.Identifier(schema), "role": sql.Identifier(role)}
        statements += [
            sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role}").format(**parts),
            sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {role}").format(**parts),
            sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {schema} FROM {role}").format(**parts),
            sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {role}").format(**parts),
        ]
        for table, held in PRIVILEGES[kind].items():
            statements += _grants_on(schema, role, table, held)
        if kind in EXECUTES:
            functions = sql.SQL(", ").join(sql.Identifier(schema, f) for f in EXECUTES[kind])
            statements.append(
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(functions, parts["role"])
            )
    return [statement.as_string(None) for statement in statements]


@dataclass(frozen=True)
class _Role:
    """A row of ``roles_lookup``."""

    name: str
    found: bool
    superuser: bool
    owner: bool


def check_roles(tx: Any, schema: str, roles: dict[str, str]) -> None:
    """Raise :class:`InvalidArgument`, naming the kind of role (``producer``...), for a
    role that does not exist, is a superuser (no grant restricts it) or owns
    ``schema`` (revoking would take the owner's own privileges away)."""
    run_sync(tx, _check_plan(schema, roles))


def _check_plan(schema: str, roles: dict[str, str]) -> Plan[None]:
    for kind, name in roles.items():
        check_text(name, kind, error=InvalidArgument)
    names = list(roles.values())
    found: list[_Role] = yield (
        queries_for(schema)["roles_lookup"],
        {"names": names, "schema": schema},
        _Role,
    )
    by_name = {row.name: row for row in found}
    for kind, name in roles.items():
        row = by_name[name]
        if not row.found:
            raise InvalidArgument(kind, f"no role named {name!r} on this server (create it first)")
        if row.superuser:
            raise InvalidArgument(kind, f"{name!r} is a superuser: no grant can restrict it")
        if row.owner:
            raise InvalidArgument(
                kind, f"{name!r} owns schema {schema!r}: the owner migrates, grant to another role"
            )
