"""Endpoints as the web surfaces show them (``sql/endpoints.sql``): one row,
:class:`Endpoint`, for the API, the dashboard and the portal; its backlog
(:class:`Backlog`) read apart, for the pages that show it.

An endpoint is shown without credentials or TLS material; its signing secrets
as stored, which :func:`shown_secrets` opens to show by fingerprint. Every
function takes the scope ``tenant_id`` (None: the operator's, every endpoint).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from dispatchers.store.web import Conn, rows
from outbox.internal import EndpointRow, json_value, queries_for, rows_plan, run_sync, scalar
from outbox.sealing import Keyring, SealBroken, Sealed, SecretKeyMissing, open_secret
from outbox.secrets import fingerprint


class Endpoint(NamedTuple):
    """An endpoint as shown (a row of ``web_endpoint_get`` and ``web_endpoint_page``)."""

    id: int
    url: str
    description: str
    event_types: list[str]
    metadata: Any
    enabled: bool
    disabled_reason: str | None
    disabled_at: datetime | None
    failure_streak: int
    failing_since: datetime | None
    last_success_at: datetime | None
    max_concurrency: int | None
    rate_limit_per_s: float | None
    rate_burst: int | None
    filter: str | None
    retry_schedule: list[float] | None
    tenant_id: int | None
    tenant: str | None
    """The external id of its tenant; None: the operator's own."""
    secrets: Any
    """jsonb: ``[{"secret", "key_id", "expires_at"}]`` in force, as stored, newest first."""
    auth_header_names: list[str]
    auth_scheme: str | None
    created_at: datetime
    updated_at: datetime


class Backlog(NamedTuple):
    """A row of ``web_endpoint_backlog``: an endpoint's messages not yet sent, and dead."""

    endpoint_id: int
    pending: int
    dead: int


NO_BACKLOG = Backlog(0, 0, 0)
"""The backlog of an endpoint not counted (none in scope)."""


def get(conn: Conn, schema: str, endpoint_id: int, *, tenant_id: int | None) -> Endpoint | None:
    """The endpoint, or None (missing, or out of scope)."""
    params = {"id": endpoint_id, "tenant_id": tenant_id}
    found = rows(conn, schema, "web_endpoint_get", params, Endpoint)
    return found[0] if found else None


def lock(conn: Conn, schema: str, endpoint_id: int, *, tenant_id: int | None) -> bool:
    """Take the endpoint's row lock for a change: whether it exists in scope."""
    params = {"id": endpoint_id, "tenant_id": tenant_id}
    return bool(rows(conn, schema, "web_endpoint_lock", params, scalar))


def page(
    conn: Conn,
    schema: str,
    *,
    tenant_id: int | None,
    after: int = 0,
    limit: int,
    enabled: bool | None = None,
    attention: bool = False,
    untenanted: bool = False,
) -> list[Endpoint]:
    """Up to ``limit`` endpoints in scope after id ``after``, by id: enabled or
    disabled ones only (``enabled``), those disabled, failing or with dead
    messages only (``attention``), those of no tenant only (``untenanted``)."""
    params = {
        "tenant_id": tenant_id,
        "after": after,
        "limit": limit,
        "enabled": enabled,
        "attention": attention,
        "untenanted": untenanted,
    }
    return rows(conn, schema, "web_endpoint_page", params, Endpoint)


def backlog(
    conn: Conn, schema: str, ids: list[int], *, tenant_id: int | None
) -> dict[int, Backlog]:
    """The backlog of each endpoint of ``ids`` in scope (a page's)."""
    if not ids:
        return {}
    params = {"ids": sorted(set(ids)), "tenant_id": tenant_id}
    return {b.endpoint_id: b for b in rows(conn, schema, "web_endpoint_backlog", params, Backlog)}


class Listed(NamedTuple):
    """An endpoint with its backlog, as a list or a page shows it: the
    endpoint's fields are read through (``listed.url``), beside ``pending`` and
    ``dead``."""

    endpoint: Endpoint
    pending: int
    dead: int

    def __getattr__(self, name: str) -> Any:
        return getattr(self.endpoint, name)


def listed(
    conn: Conn, schema: str, shown: list[Endpoint], *, tenant_id: int | None
) -> list[Listed]:
    """``shown`` (endpoints in scope) each with its backlog, read in one statement."""
    counts = backlog(conn, schema, [e.id for e in shown], tenant_id=tenant_id)
    return [Listed(e, *counts.get(e.id, NO_BACKLOG)[1:]) for e in shown]


class _EndpointTenant(NamedTuple):
    id: int
    tenant: str


def tenants_of(conn: Conn, schema: str, ids: list[int]) -> dict[int, str]:
    """The tenant (external id) of each endpoint of ``ids`` that has one."""
    if not ids:
        return {}
    params = {"ids": sorted(set(ids))}
    return {
        r.id: r.tenant for r in rows(conn, schema, "web_endpoint_tenants", params, _EndpointTenant)
    }


def tenant_id(conn: Conn, schema: str, external_id: str) -> int | None:
    """The row id of the tenant ``external_id``, or None if there is none."""
    found = rows(conn, schema, "web_tenant_id", {"external_id": external_id}, scalar)
    return int(found[0]) if found else None


def secrets_sealed(conn: Conn, schema: str) -> bool:
    """Whether any signing secret is sealed (then one made without a key would
    be the one stored in plain text)."""
    return bool(rows(conn, schema, "web_sealed_secrets", {}, scalar)[0])


def stored(conn: Conn, schema: str, endpoint_id: int) -> EndpointRow | None:
    """The operator's whole row of the endpoint as the library reads it (its
    credentials and TLS settings too, secrets unopened), or None."""
    query = queries_for(schema)["endpoint_get"]
    found = run_sync(conn, rows_plan(query, {"id": endpoint_id}, EndpointRow))
    return found[0] if found else None


class ShownSecret(NamedTuple):
    """A signing secret as a page shows it: its fingerprint, or why it cannot."""

    fingerprint: str | None
    key_id: str | None
    expires_at: datetime | None
    unavailable: str | None
    """Why there is no fingerprint: sealed under a key not given, or broken."""


def shown_secrets(stored: Any, endpoint_id: int, keyring: Keyring | None) -> list[ShownSecret]:
    """The secrets of an endpoint as stored (jsonb ``[{"secret", "key_id",
    "expires_at"}]``), each opened by ``keyring`` if it can be."""
    shown = []
    for s in json_value(stored):
        key_id = s["key_id"]
        expires = datetime.fromisoformat(s["expires_at"]) if s["expires_at"] else None
        try:
            text = open_secret(keyring, Sealed(s["secret"], key_id), endpoint_id=endpoint_id)
        except SecretKeyMissing:
            why = f"sealed under key {key_id}, which this dashboard was not given"
            shown.append(ShownSecret(None, key_id, expires, why))
        except SealBroken:
            why = f"sealed under key {key_id}, but does not open: altered or copied"
            shown.append(ShownSecret(None, key_id, expires, why))
        else:
            shown.append(ShownSecret(fingerprint(text), key_id, expires, None))
    return shown
