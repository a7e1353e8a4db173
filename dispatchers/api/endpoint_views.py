"""How the API reads an endpoint for a request: as the token may see it (a
tenant's token, its tenant's endpoints only; any other is answered 404, as one
that does not exist), locked for a change, without credentials or TLS
material, its signing secrets by fingerprint; and which tenant a list is kept
to.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dispatchers.api.calls import Call, not_found
from dispatchers.api.problems import Problem
from dispatchers.api.responses import EndpointOut, SecretOut
from dispatchers.api.store import Conn
from dispatchers.store.web import endpoints
from dispatchers.store.web.endpoints import Endpoint
from outbox.internal import json_value
from outbox.sealing import Keyring, SealBroken, Sealed, SecretKeyMissing, open_secret
from outbox.secrets import fingerprint


def shown(endpoint: Endpoint, keyring: Keyring | None) -> EndpointOut:
    """``endpoint`` as the API answers it: its signing secrets by fingerprint."""
    return EndpointOut(
        id=endpoint.id,
        url=endpoint.url,
        description=endpoint.description,
        event_types=list(endpoint.event_types),
        metadata=json_value(endpoint.metadata),
        enabled=endpoint.enabled,
        disabled_reason=endpoint.disabled_reason,
        disabled_at=endpoint.disabled_at,
        failure_streak=endpoint.failure_streak,
        failing_since=endpoint.failing_since,
        last_success_at=endpoint.last_success_at,
        max_concurrency=endpoint.max_concurrency,
        rate_limit_per_s=endpoint.rate_limit_per_s,
        burst=endpoint.rate_burst,
        filter=endpoint.filter,
        retry_schedule=endpoint.retry_schedule,
        tenant=endpoint.tenant,
        secrets=[_secret(endpoint.id, s, keyring) for s in json_value(endpoint.secrets)],
        header_names=list(endpoint.auth_header_names),
        auth_scheme=endpoint.auth_scheme,
        created_at=endpoint.created_at,
        updated_at=endpoint.updated_at,
    )


def _secret(endpoint_id: int, stored: dict[str, Any], keyring: Keyring | None) -> SecretOut:
    try:
        secret = open_secret(
            keyring, Sealed(stored["secret"], stored["key_id"]), endpoint_id=endpoint_id
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
    found = endpoints.get(conn, call.schema, endpoint_id, tenant_id=call.tenant_id)
    if found is None:
        raise not_found("endpoint", endpoint_id)
    return shown(found, call.api.keyring)


def locked(conn: Conn, call: Call, endpoint_id: int) -> EndpointOut:
    """:func:`view`, having taken the endpoint's row lock for a change."""
    if not endpoints.lock(conn, call.schema, endpoint_id, tenant_id=call.tenant_id):
        raise not_found("endpoint", endpoint_id)
    return view(conn, call, endpoint_id)


def tenant_row(conn: Conn, call: Call, external_id: str) -> int | None:
    """The row id of the tenant ``external_id``, or None if there is none."""
    return endpoints.tenant_id(conn, call.schema, external_id)


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
    if call.api.keyring is None and endpoints.secrets_sealed(conn, call.schema):
        raise Problem(
            409,
            "signing secrets are sealed in this database, but this server was not given "
            "the key (--secrets-key-file or OUTBOX_SECRETS_KEY): a new secret would be "
            "stored in plain text",
        )
