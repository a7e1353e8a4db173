"""The management API's database access: its own statements (``queries.sql``),
their typed rows, the database's key of page cursors, and the tokens and audit
log they keep.

Handlers run their work in a worker thread on a pooled connection, through a
:class:`Store` (the dashboard's, whose process serves the API): reads in a
``READ ONLY`` transaction, changes in one transaction that commits when the
work returns, with the audit entry that records them. The functions on tokens
take a connection in a transaction of the caller's, so that ``outbox
api-tokens`` uses them as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import psycopg

from dispatchers.api.fingerprints import fingerprint
from dispatchers.api.tokens import Principal, Scope, new_token, shown_prefix, token_digest
from outbox.errors import OutboxError
from outbox.internal import Queries, catalog, rows_plan, run_sync, scalar

T = TypeVar("T")

QUERIES = Path(__file__).with_name("queries.sql")
"""The API's own statements (shipped in the wheel with the package)."""

Conn = psycopg.Connection[Any]


class Store(Protocol):
    """Where the API's work runs: the dashboard's store serves."""

    schema: str

    async def read(self, work: Callable[[Conn], T]) -> T: ...

    async def write(self, work: Callable[[Conn], T]) -> T: ...


def api_queries(schema: str) -> Queries:
    """The API's statements bound to ``schema`` (cached by the loader)."""
    return catalog(schema, (QUERIES,))


def rows(
    conn: Conn, schema: str, name: str, params: dict[str, Any], row: Callable[..., T]
) -> list[T]:
    """The rows of statement ``name``, each made by ``row``."""
    return run_sync(conn, rows_plan(api_queries(schema)[name], params, row), schema=schema)


def cursor_key(conn: Conn, schema: str) -> bytes:
    """The key page cursors are signed with: the database's own (``api_cursor_key``,
    made by ``outbox migrate``), the same for every process serving it."""
    found = rows(conn, schema, "api_cursor_key", {}, scalar)
    if len(found) != 1 or len(found[0]) < 32:
        raise OutboxError(
            f"{schema}.api_cursor_key holds no key of 32 bytes or more: the migration "
            "that made it was undone, or its row changed"
        )
    return bytes(found[0])


# -- tokens ------------------------------------------------------------------------


class TokenRow(NamedTuple):
    """A row of ``api_token_list``."""

    id: int
    name: str
    scope: str
    tenant: str | None
    shown_prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class UnknownTenant(LookupError):
    """A tenant named by its external id does not exist."""


def create_token(
    conn: Conn, schema: str, *, scope: Scope, name: str = "", tenant: str | None = None
) -> tuple[int, str]:
    """A new token of ``scope`` (of ``tenant``, an external id, if given): its id
    and the token itself, which is stored only as its digest. Raises
    :class:`UnknownTenant` for a tenant that does not exist."""
    token = new_token()
    params = {
        "name": name,
        "scope": scope,
        "tenant": tenant,
        "digest": token_digest(token),
        "shown_prefix": shown_prefix(token),
    }
    ids = rows(conn, schema, "api_token_insert", params, scalar)
    if not ids:
        raise UnknownTenant(tenant)
    return int(ids[0]), token


def list_tokens(conn: Conn, schema: str) -> list[TokenRow]:
    """Every token, revoked ones too, by id."""
    return rows(conn, schema, "api_token_list", {}, TokenRow)


class _Revoked(NamedTuple):
    found: bool
    revoked: bool


def revoke_token(conn: Conn, schema: str, token_id: int) -> bool | None:
    """Revoke token ``token_id``: True if this revoked it, False if it was
    revoked already, None if there is no such token."""
    (row,) = rows(conn, schema, "api_token_revoke", {"id": token_id}, _Revoked)
    return row.revoked if row.found else None


def find_token(conn: Conn, schema: str, digest: bytes) -> Principal | None:
    """Who holds the token of SHA-256 ``digest``, unless it is revoked."""
    found = rows(conn, schema, "api_token_find", {"digest": digest}, Principal)
    return found[0] if found else None


# -- the audit log -----------------------------------------------------------------


def audit(
    conn: Conn,
    schema: str,
    who: Principal,
    action: str,
    resource: str,
    resource_id: object = None,
    *,
    before: Any = None,
    after: Any = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Record a write of ``who`` in the transaction that makes it: the resource's
    fingerprints before and after (JSON-ready views without secrets; None where
    it did not exist), never its values."""
    params = {
        "token_id": who.token_id,
        "token_name": who.name,
        "tenant_id": who.tenant_id,
        "action": action,
        "resource": resource,
        "resource_id": None if resource_id is None else str(resource_id),
        "before": fingerprint(before),
        "after": fingerprint(after),
        "detail": json.dumps(detail or {}, default=str),
    }
    run_sync(
        conn, rows_plan(api_queries(schema)["api_audit_insert"], params, scalar), schema=schema
    )
