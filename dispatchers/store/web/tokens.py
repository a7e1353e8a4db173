"""The management API's own tables (``sql/tokens.sql``): its tokens (stored as
digests), its audit log and the database's key of page cursors. Operator-only:
no tenant scope applies; the API decides who may call these.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from dispatchers.store.web import Conn, rows
from outbox.internal import scalar


class TokenRow(NamedTuple):
    """A token as listed (a row of ``web_token_list``)."""

    id: int
    name: str
    scope: str
    tenant: str | None
    shown_prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenHolder(NamedTuple):
    """Who holds a token (the row of ``web_token_find``)."""

    token_id: int
    name: str
    scope: str
    tenant_id: int | None
    tenant: str | None


class AuditEntry(NamedTuple):
    """A row of ``web_audit_page``."""

    id: int
    at: datetime
    token_id: int
    token_name: str
    tenant_id: int | None
    action: str
    resource: str
    resource_id: str | None
    before_sha256: str | None
    after_sha256: str | None
    detail: dict[str, Any]


class _Revoked(NamedTuple):
    found: bool
    revoked: bool


def insert_token(
    conn: Conn,
    schema: str,
    *,
    name: str,
    scope: str,
    tenant: str | None,
    digest: bytes,
    shown_prefix: str,
) -> int | None:
    """Store a token by its digest: its id, or None if ``tenant`` (an external
    id) names no tenant."""
    params = {
        "name": name,
        "scope": scope,
        "tenant": tenant,
        "digest": digest,
        "shown_prefix": shown_prefix,
    }
    ids = rows(conn, schema, "web_token_insert", params, scalar)
    return int(ids[0]) if ids else None


def tokens(conn: Conn, schema: str) -> list[TokenRow]:
    """Every token, revoked ones too, by id."""
    return rows(conn, schema, "web_token_list", {}, TokenRow)


def revoke_token(conn: Conn, schema: str, token_id: int) -> bool | None:
    """Revoke token ``token_id``: True if this revoked it, False if it was
    revoked already, None if there is no such token."""
    (row,) = rows(conn, schema, "web_token_revoke", {"id": token_id}, _Revoked)
    return row.revoked if row.found else None


def find_token(conn: Conn, schema: str, digest: bytes) -> TokenHolder | None:
    """Who holds the token of SHA-256 ``digest``, unless it is revoked (its last
    use recorded at most once a minute)."""
    found = rows(conn, schema, "web_token_find", {"digest": digest}, TokenHolder)
    return found[0] if found else None


def insert_audit(
    conn: Conn,
    schema: str,
    *,
    token_id: int,
    token_name: str,
    tenant_id: int | None,
    action: str,
    resource: str,
    resource_id: str | None,
    before: str | None,
    after: str | None,
    detail: str,
) -> None:
    """Append an entry to the audit log (``detail``: a JSON text)."""
    params = {
        "token_id": token_id,
        "token_name": token_name,
        "tenant_id": tenant_id,
        "action": action,
        "resource": resource,
        "resource_id": resource_id,
        "before": before,
        "after": after,
        "detail": detail,
    }
    rows(conn, schema, "web_audit_insert", params, scalar)


def audit_page(conn: Conn, schema: str, *, before: int, limit: int) -> list[AuditEntry]:
    """Up to ``limit`` entries of the audit log, newest first, before id ``before``."""
    return rows(conn, schema, "web_audit_page", {"before": before, "limit": limit}, AuditEntry)


def cursor_keys(conn: Conn, schema: str) -> list[bytes]:
    """The rows of ``api_cursor_key``: the key page cursors are signed with (one,
    made by the migration)."""
    return [bytes(k) for k in rows(conn, schema, "web_cursor_key", {}, scalar)]
