"""How the API reads an endpoint for a request: as the token may see it (a
tenant's token, its tenant's endpoints only; any other is answered 404, as one
that does not exist), locked for a change, without credentials or TLS
material, its signing secrets by fingerprint; and which tenant a list is kept
to.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from dispatchers.api.answers import EndpointOut, SecretOut
from dispatchers.api.calls import Call, not_found
from dispatchers.api.problems import Problem
from dispatchers.api.store import Conn, rows
from outbox.internal import json_value, scalar
from outbox.sealing import Keyring, SealBroken, Sealed, SecretKeyMissing, open_secret
from outbox.secrets import fingerprint


class EndpointView(NamedTuple):
    """A row of ``api_endpoint_get`` and ``api_endpoint_page``."""

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
    secrets: Any
    auth_header_names: list[str]
    auth_scheme: str | None
    created_at: datetime
    updated_at: datetime

    def shown(self, keyring: Keyring | None) -> EndpointOut:
        return EndpointOut(
            id=self.id,
            url=self.url,
            description=self.description,
            event_types=list(self.event_types),
            metadata=json_value(self.metadata),
            enabled=self.enabled,
            disabled_reason=self.disabled_reason,
            disabled_at=self.disabled_at,
            failure_streak=self.failure_streak,
            failing_since=self.failing_since,
            last_success_at=self.last_success_at,
            max_concurrency=self.max_concurrency,
            rate_limit_per_s=self.rate_limit_per_s,
            burst=self.rate_burst,
            filter=self.filter,
            retry_schedule=self.retry_schedule,
            tenant=self.tenant,
            secrets=[self._secret(s, keyring) for s in json_value(self.secrets)],
            header_names=list(self.auth_header_names),
            auth_scheme=self.auth_scheme,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )

    def _secret(self, stored: dict[str, Any], keyring: Keyring | None) -> SecretOut:
        try:
            secret = open_secret(
                keyring, Sealed(stored["secret"], stored["key_id"]), endpoint_id=self.id
            )
            shown: str | None = fingerprint(secret)
        except (SecretKeyMissing, SealBroken):
            shown = None
        expires = stored["expires_at"]
        return SecretOut(
            fingerprint=shown,
            key_id=stored["key_id"],
            expires_at=datetime.fromisoformat(expires) if isinstance(expires, str) else None,
        )


def view(conn: Conn, call: Call, endpoint_id: int) -> EndpointOut:
    """The endpoint as the token may see it; 404 if it may not (or there is none)."""
    found = rows(
        conn,
        call.schema,
        "api_endpoint_get",
        {"id": endpoint_id, "tenant_id": call.tenant_id},
        EndpointView,
    )
    if not found:
        raise not_found("endpoint", endpoint_id)
    return found[0].shown(call.api.keyring)


def locked(conn: Conn, call: Call, endpoint_id: int) -> EndpointOut:
    """:func:`view`, having taken the endpoint's row lock for a change."""
    params = {"id": endpoint_id, "tenant_id": call.tenant_id}
    if not rows(conn, call.schema, "api_endpoint_lock", params, scalar):
        raise not_found("endpoint", endpoint_id)
    return view(conn, call, endpoint_id)


def tenant_row(conn: Conn, call: Call, external_id: str) -> int | None:
    """The row id of the tenant ``external_id``, or None if there is none."""
    found = rows(conn, call.schema, "api_tenant_id", {"external_id": external_id}, scalar)
    return int(found[0]) if found else None


def filtered_tenant(conn: Conn, call: Call, given: str | None, field: str) -> int | bool | None:
    """The tenant rows are kept to: the token's own, or the one the request
    names (``given``); False when that tenant does not exist (nothing
    matches). A tenant's token naming another tenant is refused (403)."""
    if given is None:
        return call.tenant_id
    if not call.who.operator and given != call.who.tenant:
        raise Problem(403, f"{field}: a tenant's token sees its own tenant only", field=field)
    row = tenant_row(conn, call, given)
    return False if row is None else row


def refuse_plain_secret(conn: Conn, call: Call) -> None:
    """409 when signing secrets are sealed here but this server holds no key: a
    secret it made would be the one stored in plain text (as the dashboard
    refuses too)."""
    if call.api.keyring is None and rows(conn, call.schema, "api_sealed_secrets", {}, scalar)[0]:
        raise Problem(
            409,
            "signing secrets are sealed in this database, but this server was not given "
            "the key (--secrets-key-file or OUTBOX_SECRETS_KEY): a new secret would be "
            "stored in plain text",
        )
