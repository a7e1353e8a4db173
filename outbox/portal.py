"""Consumer portal links: signed, expiring URLs to a tenant's own webhook pages.

A link's token (``obp_`` then 32 random bytes) is shown once; the database stores
its SHA-256 digest only. A link works until it expires or is revoked, and goes
with its tenant. All functions run in the caller's transaction and never commit;
bad input raises :class:`outbox.InvalidArgument` before anything is written.

Design: docs/explanation/design/portal-links.md
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from outbox._endpoint_fields import check_tenant_id
from outbox._queries import queries_for
from outbox._transaction import Plan, rows_plan, run_sync, scalar
from outbox.defaults import DEFAULT_SCHEMA
from outbox.errors import InvalidArgument

__all__ = [
    "DEFAULT_EXPIRY",
    "MAX_EXPIRY",
    "MIN_EXPIRY",
    "PATH_PREFIX",
    "TOKEN_PREFIX",
    "LinkHolder",
    "PortalLink",
    "create_link",
    "find_link",
    "is_token",
    "revoke",
    "revoke_tenant",
    "token_digest",
]

TOKEN_PREFIX = "obp_"  # noqa: S105 (a prefix, not a secret)
"""How every portal token starts (so that one found in a log or a paste is
recognised for what it is)."""

PATH_PREFIX = "/portal/"
"""Where the dashboard serves the portal: a link's path is this, its token, and
a slash."""

DEFAULT_EXPIRY = timedelta(hours=1)
MIN_EXPIRY = timedelta(minutes=1)
MAX_EXPIRY = timedelta(days=30)
"""The bounds of a link's lifetime."""

FORGET_AFTER = timedelta(days=30)
"""How long an expired link is kept (seen as expired) before making another
link for its tenant deletes it."""

_TOKEN = re.compile(r"obp_[A-Za-z0-9_-]{43}")


@dataclass(frozen=True)
class PortalLink:
    """A link just made: its token is shown here and nowhere else again."""

    id: int
    tenant: str
    token: str = field(repr=False)
    expires_at: datetime

    @property
    def url_path(self) -> str:
        """The link's path, to put after the dashboard's address."""
        return f"{PATH_PREFIX}{self.token}/"


class LinkHolder(NamedTuple):
    """Who a working link lets in: the row of ``portal_link_find``."""

    id: int
    """The link's id (what logs name, never its token)."""
    tenant_id: int
    """The tenant's key in the database (``endpoints.tenant_id``)."""
    tenant: str
    """The tenant's external id."""
    tenant_name: str
    expires_at: datetime


class _Made(NamedTuple):
    id: int
    expires_at: datetime


def is_token(value: object) -> bool:
    """Whether ``value`` has the form of a portal token (it may still open nothing)."""
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None


def token_digest(token: str) -> bytes:
    """What the database stores of a token: its SHA-256 digest."""
    return hashlib.sha256(token.encode("ascii")).digest()


def _check_expires(expires: object) -> float:
    if not isinstance(expires, timedelta):
        raise InvalidArgument("expires", f"must be a timedelta, not {type(expires).__name__}")
    if not MIN_EXPIRY <= expires <= MAX_EXPIRY:
        raise InvalidArgument("expires", "must be from 1 minute to 30 days")
    return expires.total_seconds()


def create_link(
    tx: Any,
    *,
    tenant: str,
    expires: timedelta = DEFAULT_EXPIRY,
    schema: str = DEFAULT_SCHEMA,
) -> PortalLink:
    """Make a link to the portal of ``tenant`` (its external id) that works for
    ``expires`` (from 1 minute to 30 days) from now. A tenant that does not
    exist is refused naming ``tenant``; nothing is written."""
    params = {
        "tenant": check_tenant_id(tenant, "tenant"),
        "seconds": _check_expires(expires),
        "forget": FORGET_AFTER.total_seconds(),
    }
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return run_sync(tx, _create_plan(schema, params, token), schema=schema)


def _create_plan(schema: str, params: dict[str, Any], token: str) -> Plan[PortalLink]:
    statement = queries_for(schema)["portal_link_insert"]
    made = yield from rows_plan(statement, {**params, "token_hash": token_digest(token)}, _Made)
    if not made:
        raise InvalidArgument("tenant", f"no tenant with id {params['tenant']!r}")
    return PortalLink(made[0].id, params["tenant"], token, made[0].expires_at)


def find_link(tx: Any, token: str, *, schema: str = DEFAULT_SCHEMA) -> LinkHolder | None:
    """The tenant that ``token`` lets in, or None if it opens no link (never
    made, expired, revoked, or its tenant deleted). A value that is not a token
    is None too, without a query."""
    if not is_token(token):
        return None
    statement = queries_for(schema)["portal_link_find"]
    plan = rows_plan(statement, {"token_hash": token_digest(token)}, LinkHolder)
    found = run_sync(tx, plan, schema=schema)
    return found[0] if found else None


def revoke(tx: Any, token: str, *, schema: str = DEFAULT_SCHEMA) -> bool:
    """End the link of ``token`` now; False if no link has it or it was revoked
    already. A value that is not a token is refused naming ``token``."""
    if not is_token(token):
        raise InvalidArgument("token", f"is not a portal token ({TOKEN_PREFIX}...)")
    statement = queries_for(schema)["portal_link_revoke"]
    ids = run_sync(
        tx, rows_plan(statement, {"token_hash": token_digest(token)}, scalar), schema=schema
    )
    return bool(ids)


def revoke_tenant(tx: Any, tenant: str, *, schema: str = DEFAULT_SCHEMA) -> int:
    """End every working link of ``tenant`` now; return how many. A tenant that
    does not exist is refused naming ``tenant``."""
    params = {"tenant": check_tenant_id(tenant, "tenant")}
    return run_sync(tx, _revoke_tenant_plan(schema, params), schema=schema)


def _revoke_tenant_plan(schema: str, params: dict[str, Any]) -> Plan[int]:
    queries = queries_for(schema)
    found = yield from rows_plan(queries["portal_tenant_id"], params, scalar)
    if not found:
        raise InvalidArgument("tenant", f"no tenant with id {params['tenant']!r}")
    revoked = yield from rows_plan(queries["portal_links_revoke_tenant"], params, scalar)
    return len(revoked)
