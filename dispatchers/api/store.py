"""The management API's access to its database: where its work runs
(:class:`Store`), the database's key of page cursors, and its tokens and audit
log, read and written through :mod:`dispatchers.store.web.tokens`.

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
from typing import Any, Protocol, TypeVar

import psycopg

from dispatchers.api.fingerprints import fingerprint
from dispatchers.api.tokens import Principal, Scope, new_token, shown_prefix, token_digest
from dispatchers.store.web import tokens
from dispatchers.store.web.tokens import TokenRow
from outbox.errors import OutboxError

T = TypeVar("T")

Conn = psycopg.Connection[Any]


class Store(Protocol):
    """Where the API's work runs: the dashboard's store serves."""

    schema: str

    async def read(self, work: Callable[[Conn], T]) -> T: ...

    async def write(self, work: Callable[[Conn], T]) -> T: ...


def cursor_key(conn: Conn, schema: str) -> bytes:
    """The key page cursors are signed with: the database's own (``api_cursor_key``,
    made by ``outbox migrate``), the same for every process serving it."""
    found = tokens.cursor_keys(conn, schema)
    if len(found) != 1 or len(found[0]) < 32:
        raise OutboxError(
            f"{schema}.api_cursor_key holds no key of 32 bytes or more: the migration "
            "that made it was undone, or its row changed"
        )
    return found[0]


# -- tokens ------------------------------------------------------------------------


class UnknownTenant(LookupError):
    """A tenant named by its external id does not exist."""


def create_token(
    conn: Conn, schema: str, *, scope: Scope, name: str = "", tenant: str | None = None
) -> tuple[int, str]:
    """A new token of ``scope`` (of ``tenant``, an external id, if given): its id
    and the token itself, which is stored only as its digest. Raises
    :class:`UnknownTenant` for a tenant that does not exist."""
    token = new_token()
    token_id = tokens.insert_token(
        conn,
        schema,
        name=name,
        scope=scope,
        tenant=tenant,
        digest=token_digest(token),
        shown_prefix=shown_prefix(token),
    )
    if token_id is None:
        raise UnknownTenant(tenant)
    return token_id, token


def list_tokens(conn: Conn, schema: str) -> list[TokenRow]:
    """Every token, revoked ones too, by id."""
    return tokens.tokens(conn, schema)


def revoke_token(conn: Conn, schema: str, token_id: int) -> bool | None:
    """Revoke token ``token_id``: True if this revoked it, False if it was
    revoked already, None if there is no such token."""
    return tokens.revoke_token(conn, schema, token_id)


def find_token(conn: Conn, schema: str, digest: bytes) -> Principal | None:
    """Who holds the token of SHA-256 ``digest``, unless it is revoked."""
    found = tokens.find_token(conn, schema, digest)
    return None if found is None else Principal(**found._asdict())


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
    tokens.insert_audit(
        conn,
        schema,
        token_id=who.token_id,
        token_name=who.name,
        tenant_id=who.tenant_id,
        action=action,
        resource=resource,
        resource_id=None if resource_id is None else str(resource_id),
        before=fingerprint(before),
        after=fingerprint(after),
        detail=json.dumps(detail or {}, default=str),
    )
