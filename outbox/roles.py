"""Least-privilege roles: what each user of the outbox is granted, and nothing more.

Four roles share an outbox schema:

- the **owner** creates it and runs ``outbox migrate``; it owns every table and is
  granted nothing here;
- a **producer** (the application) enqueues and publishes: it inserts messages,
  their keys and the record of each event, takes ids from the messages sequence
  and reads endpoints' subscriptions. It cannot read signing secrets, nor change
  a message once written;
- a **dispatcher** claims, renews, completes and rescues messages, trims history
  and old event records, reads signing secrets and retry schedules, and records
  endpoint health. It cannot change an
  endpoint's URL, subscriptions or secrets, nor write a message;
- an **operator** runs the admin commands (endpoints, dead letters, replay,
  status), which between them read and write every table of the outbox; it cannot
  change the schema.

:func:`grants` returns the statements: for each role, first every privilege it
holds in the schema is revoked, then what it needs is granted. Applying them again
after a migration (as the owner) leaves each role with exactly the privileges of
the schema's new version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql

from outbox._queries import check_schema_name, queries_for
from outbox._transaction import Plan, run_sync
from outbox.errors import InvalidArgument

__all__ = ["ROLES", "check_roles", "grants"]

ROLES = ("producer", "dispatcher", "operator")
"""The roles :func:`grants` knows, in the order it grants them."""


@dataclass(frozen=True)
class _Grant:
    """Privileges on one table (or sequence), on some of its columns if named."""

    privileges: tuple[str, ...]
    on: str
    columns: tuple[str, ...] = ()
    sequence: bool = False


_ENDPOINT_HEALTH = (
    "enabled",
    "disabled_reason",
    "disabled_at",
    "failure_streak",
    "failing_since",
    "last_success_at",
    "updated_at",
)
"""The columns of endpoints that the dispatcher's completions write."""

_ALL = ("SELECT", "INSERT", "UPDATE", "DELETE")
_DATA_TABLES = (
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
    "event_types",
    "destination_health",
)

_NEEDS: dict[str, tuple[_Grant, ...]] = {
    "producer": (
        _Grant(("INSERT",), "messages"),
        # the id that enqueue and publish return (INSERT ... RETURNING id)
        _Grant(("SELECT",), "messages", ("id",)),
        _Grant(("SELECT", "INSERT"), "message_keys"),
        # publish records each event once, and reads it when published again
        _Grant(("SELECT", "INSERT"), "events"),
        # publish fans out to the subscribed endpoints
        _Grant(("SELECT",), "endpoints"),
        # a message's id is taken for its key first (nextval)
        _Grant(("USAGE",), "messages_id_seq", sequence=True),
    ),
    "dispatcher": (
        _Grant(("SELECT", "UPDATE", "DELETE"), "messages"),
        # retention locks the rows it removes (FOR UPDATE needs UPDATE on a column)
        _Grant(("SELECT", "INSERT", "DELETE"), "delivered"),
        _Grant(("UPDATE",), "delivered", ("completed_at",)),
        _Grant(("SELECT", "DELETE"), "message_keys"),
        # retention removes old events, locking them first (as for delivered)
        _Grant(("SELECT", "DELETE"), "events"),
        _Grant(("UPDATE",), "events", ("created_at",)),
        _Grant(("SELECT", "INSERT", "DELETE"), "attempts"),
        _Grant(("SELECT",), "endpoints"),
        _Grant(("UPDATE",), "endpoints", _ENDPOINT_HEALTH),
        _Grant(("SELECT",), "endpoint_secrets"),
        # the policies of plain destinations are read; the claim takes (and
        # completion frees) every destination's slots, locking them first
        _Grant(("SELECT",), "destination_policies"),
        _Grant(("SELECT",), "destination_slots"),
        _Grant(("UPDATE",), "destination_slots", ("message_id",)),
        _Grant(("SELECT",), "rate_slots"),
        _Grant(("UPDATE",), "rate_slots", ("next_at",)),
        # a claim reads the retry schedule of each webhook's event type
        _Grant(("SELECT",), "event_types"),
        # breakers and holds: claims take probes, outcomes open and close them
        _Grant(_ALL, "destination_health"),
        # the schema's version, which a dispatcher checks before it starts
        _Grant(("SELECT",), "schema_migrations"),
    ),
    "operator": (
        # endpoints add inserts ids from identity columns, which needs no grant on
        # their sequences
        *(_Grant(_ALL, table) for table in _DATA_TABLES),
    ),
}


def _grant(schema: str, role: str, grant: _Grant) -> sql.Composed:
    if grant.columns:
        columns = sql.SQL(", ").join(map(sql.Identifier, grant.columns))
        privileges = sql.SQL(", ").join(
            sql.SQL("{} ({})").format(sql.SQL(p), columns) for p in grant.privileges
        )
    else:
        privileges = sql.SQL(", ").join(map(sql.SQL, grant.privileges))
    kind = sql.SQL("SEQUENCE" if grant.sequence else "TABLE")
    return sql.SQL("GRANT {} ON {} {} TO {}").format(
        privileges, kind, sql.Identifier(schema, grant.on), sql.Identifier(role)
    )


def grants(
    schema: str,
    *,
    producer: str | None = None,
    dispatcher: str | None = None,
    operator: str | None = None,
) -> list[str]:
    """The statements that give each named role exactly what it needs in ``schema``.

    Pure: nothing is read or run. Role and schema names may be any text; they are
    quoted as identifiers. The statements are built from parts (privileges that
    are this module's constants, and identifiers) with :mod:`psycopg.sql`, not
    written in a ``.sql`` file: their roles and tables vary with the call.
    """
    check_schema_name(schema)
    named = {"producer": producer, "dispatcher": dispatcher, "operator": operator}
    given = [(kind, role) for kind, role in named.items() if role is not None]
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
            sql.SQL("GRANT USAGE ON SCHEMA {schema} TO {role}").format(**parts),
            *(_grant(schema, role, grant) for grant in _NEEDS[kind]),
        ]
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
