"""An endpoint as it is read: :class:`Endpoint` and its :class:`Secret` values,
and :class:`EndpointRow`, the row of ``endpoint_get`` and ``endpoint_list`` they
are made from (signing secrets opened by a keyring; the client key and the
credentials left sealed: only the dispatcher opens them, and an update that
keeps some of the credentials). :mod:`outbox.endpoints` writes endpoints and
exports these types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from outbox._endpoint_tls import pem_digest
from outbox.sealing import Keyring, Sealed, open_secret
from outbox.secrets import fingerprint

__all__ = ["Endpoint", "EndpointRow", "Secret", "TenantDefaults", "json_value"]


@dataclass(frozen=True)
class Secret:
    """A signing secret; ``expires_at`` is set on the old one during rotation;
    ``key_id`` names the key it is sealed under at rest (None: plain text)."""

    secret: str = field(repr=False)
    expires_at: datetime | None = None
    key_id: str | None = None


@dataclass(frozen=True)
class Endpoint:
    """One webhook endpoint, as stored."""

    id: int
    url: str
    description: str
    event_types: list[str]
    secrets: list[Secret] = field(repr=False)
    metadata: dict[str, Any]
    enabled: bool
    disabled_reason: str | None
    disabled_at: datetime | None
    failure_streak: int
    failing_since: datetime | None
    last_success_at: datetime | None
    max_concurrency: int | None
    created_at: datetime
    updated_at: datetime
    #: requests per second at most, with a burst (see :mod:`outbox.destinations`)
    rate_limit_per_s: float | None = None
    burst: int | None = None
    # TLS of its deliveries (see outbox._endpoint_tls)
    ca_bundle: str | None = field(default=None, repr=False)
    """PEM certificates its deliveries verify against, instead of the system's roots."""
    client_cert: str | None = field(default=None, repr=False)
    """The PEM client certificate its deliveries present (mutual TLS)."""
    client_key: Sealed | None = field(default=None, repr=False)
    """The certificate's private key as stored: sealed, or plain text (no key id)."""
    #: a JMESPath expression on the payload that an event must pass (outbox._filters)
    filter: str | None = None
    retry_schedule: list[float] | None = None
    """Seconds before each retry of its messages (the last repeats); None: the
    event type's schedule, else the dispatcher's default."""
    # its credentials (see outbox._endpoint_auth): what may be shown of them
    header_names: list[str] = field(default_factory=list)
    """The names of the static headers its deliveries carry (their values are sealed)."""
    auth_scheme: str | None = None
    """What sets ``Authorization``: ``basic``, ``bearer``, ``oauth2``, or None."""
    basic_username: str | None = None
    oauth2_token_url: str | None = None
    oauth2_client_id: str | None = None
    oauth2_scope: str | None = None
    oauth2_audience: str | None = None
    auth: Sealed | None = field(default=None, repr=False)
    """Every credential (header values, password, token, client secret) as stored:
    one JSON value, sealed, or plain text (no key id)."""
    tenant: str | None = None
    """The external id of the tenant it belongs to (see :mod:`outbox.tenants`);
    None: the operator's own, which gets the events published for no tenant."""

    def active_secrets(self, now: datetime) -> list[str]:
        """The secrets that sign right now (more than one during a rotation)."""
        return [s.secret for s in self.secrets if s.expires_at is None or s.expires_at > now]

    def as_dict(self, *, show_secrets: bool = False) -> dict[str, Any]:
        """A JSON-friendly view; secrets are masked unless asked for."""
        return {
            "id": self.id,
            "url": self.url,
            "description": self.description,
            "event_types": self.event_types,
            "secrets": [
                {
                    "secret": s.secret if show_secrets else fingerprint(s.secret),
                    "expires_at": s.expires_at,
                    "key_id": s.key_id,
                }
                for s in self.secrets
            ],
            "metadata": self.metadata,
            "enabled": self.enabled,
            "disabled_reason": self.disabled_reason,
            "disabled_at": self.disabled_at,
            "failure_streak": self.failure_streak,
            "failing_since": self.failing_since,
            "last_success_at": self.last_success_at,
            "max_concurrency": self.max_concurrency,
            "rate_limit_per_s": self.rate_limit_per_s,
            "burst": self.burst,
            "filter": self.filter,
            "retry_schedule": self.retry_schedule,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "ca_bundle_sha256": pem_digest(self.ca_bundle),
            "client_cert_sha256": pem_digest(self.client_cert),
            "client_key": None if self.client_key is None else {"key_id": self.client_key.key_id},
            "headers": list(self.header_names),
            "auth": self.auth_view(),
            "credentials": None if self.auth is None else {"key_id": self.auth.key_id},
            "tenant": self.tenant,
        }

    def auth_view(self) -> dict[str, Any] | None:
        """What sets ``Authorization``, as it may be shown (no password, token or
        client secret), or None."""
        if self.auth_scheme == "basic":
            return {"scheme": "basic", "username": self.basic_username}
        if self.auth_scheme == "oauth2":
            return {
                "scheme": "oauth2",
                "token_url": self.oauth2_token_url,
                "client_id": self.oauth2_client_id,
                "scope": self.oauth2_scope,
                "audience": self.oauth2_audience,
            }
        return None if self.auth_scheme is None else {"scheme": self.auth_scheme}


def _parse_time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


class EndpointRow(NamedTuple):
    """A row of ``endpoint_get`` and ``endpoint_list``, with the database's clock
    (``now``)."""

    id: int
    url: str
    description: str
    event_types: list[str]
    metadata: Any  # jsonb: a dict, or its text from drivers that do not decode jsonb
    enabled: bool
    disabled_reason: str | None
    disabled_at: datetime | None
    failure_streak: int
    failing_since: datetime | None
    last_success_at: datetime | None
    max_concurrency: int | None
    rate_limit_per_s: float | None
    rate_burst: int | None
    created_at: datetime
    updated_at: datetime
    now: datetime
    ca_bundle: str | None
    client_cert: str | None
    client_key: str | None
    client_key_id: str | None
    retry_schedule: list[float] | None
    #: jsonb, likewise: [{"id", "secret", "key_id", "expires_at"}], newest first
    secrets: Any
    filter: str | None
    auth: str | None
    auth_key_id: str | None
    auth_scheme: str | None
    auth_header_names: list[str]
    basic_username: str | None
    oauth2_token_url: str | None
    oauth2_client_id: str | None
    oauth2_scope: str | None
    oauth2_audience: str | None
    tenant: str | None

    def stored_secrets(self, keyring: Keyring | None) -> list[tuple[int, Secret]]:
        """The endpoint's secrets, opened by ``keyring``, with the ids of their
        rows, newest first."""
        return [
            (
                s["id"],
                Secret(
                    open_secret(keyring, Sealed(s["secret"], s["key_id"]), endpoint_id=self.id),
                    _parse_time(s["expires_at"]),
                    s["key_id"],
                ),
            )
            for s in json_value(self.secrets)
        ]

    def endpoint(self, keyring: Keyring | None) -> Endpoint:
        return Endpoint(
            id=self.id,
            url=self.url,
            description=self.description,
            event_types=list(self.event_types),
            secrets=[secret for _, secret in self.stored_secrets(keyring)],
            metadata=json_value(self.metadata),
            enabled=self.enabled,
            disabled_reason=self.disabled_reason,
            disabled_at=self.disabled_at,
            failure_streak=self.failure_streak,
            failing_since=self.failing_since,
            last_success_at=self.last_success_at,
            max_concurrency=self.max_concurrency,
            created_at=self.created_at,
            updated_at=self.updated_at,
            rate_limit_per_s=self.rate_limit_per_s,
            burst=self.rate_burst,
            ca_bundle=self.ca_bundle,
            client_cert=self.client_cert,
            client_key=(
                None if self.client_key is None else Sealed(self.client_key, self.client_key_id)
            ),
            filter=self.filter,
            retry_schedule=self.retry_schedule,
            header_names=list(self.auth_header_names),
            auth_scheme=self.auth_scheme,
            basic_username=self.basic_username,
            oauth2_token_url=self.oauth2_token_url,
            oauth2_client_id=self.oauth2_client_id,
            oauth2_scope=self.oauth2_scope,
            oauth2_audience=self.oauth2_audience,
            auth=None if self.auth is None else Sealed(self.auth, self.auth_key_id),
            tenant=self.tenant,
        )


class TenantDefaults(NamedTuple):
    """A row of ``tenant_defaults``: what an endpoint added to the tenant takes
    unless it is given its own."""

    id: int
    rate_limit_per_s: float | None
    rate_burst: int | None
    retry_schedule: list[float] | None

    def applied_to(self, params: dict[str, Any]) -> dict[str, Any]:
        """The parameters of ``endpoint_insert`` for an endpoint of this tenant."""
        applied = {**params, "tenant_id": self.id}
        if params["rate_limit"] is None and self.rate_limit_per_s is not None:
            applied["rate_limit"] = self.rate_limit_per_s
            applied["burst"] = self.rate_burst
        if params["retry_schedule"] is None and self.retry_schedule is not None:
            applied["retry_schedule"] = list(self.retry_schedule)
        return applied


def json_value(value: Any) -> Any:
    """A jsonb value: decoded already, or its text from drivers that do not decode jsonb."""
    return json.loads(value) if isinstance(value, str) else value
