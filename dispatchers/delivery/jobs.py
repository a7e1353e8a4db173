"""What the dispatcher sends: a :class:`Job` per claimed message, made from the
claim's row once its secrets are opened (:mod:`dispatchers.runtime.unseal`)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import datetime

from dispatchers.delivery.auth import ClientCredentials


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed message: what to send, and the attempt number that fences it."""

    id: int
    idempotency_key: str
    url: str
    method: str
    headers: dict[str, str]
    body: bytes
    content_type: str
    attempts: int
    max_attempts: int
    endpoint_id: int | None
    event_type: str | None
    created_at: datetime
    destination: str  # what the dispatcher bounds requests in flight by
    retry_base: int = 0
    secrets: tuple[str, ...] = ()
    """The signing secrets in force, opened (see :mod:`dispatchers.delivery.unsealing`)."""
    ordering_key: str | None = None
    trace_context: dict[str, str] | None = None
    """The W3C context (``traceparent``, ``tracestate``) of the span that wrote
    the message: each attempt's span is its child (:mod:`dispatchers.delivery.tracing`)."""
    retry_schedule: list[float] | None = None
    """The delays before its retries: its endpoint's schedule, else its event
    type's, else None for the dispatcher's default
    (:func:`dispatchers.delivery.retry.policy_for`)."""
    probe: bool = False
    """The one request sent to a destination whose circuit breaker is open (see
    :mod:`dispatchers.delivery.health`): its outcome closes the breaker or opens it again."""
    tls: ssl.SSLContext | None = None
    """The endpoint's own TLS context, for its CA bundle or client certificate
    (see :mod:`dispatchers.delivery.tls`); None: the default one."""
    oauth2: ClientCredentials | None = None
    """The endpoint's OAuth2 client credentials, opened: each request carries a
    bearer token obtained with them (see :mod:`dispatchers.delivery.oauth2`)."""
    secrets_unavailable: str | None = None
    """Why the endpoint's secrets or client key could not be opened (naming the
    key): the message must not be sent unsigned, or without its certificate."""
    missing_keys: tuple[str, ...] = ()
    """With ``secrets_unavailable``: the ids of the keys its secrets, client key or
    credentials are sealed under that the dispatcher lacks (none when they are
    under keys it holds, but do not open)."""
    auth_headers: dict[str, str] | None = None
    """The endpoint's static headers and its ``Authorization`` (basic or bearer),
    opened (see :mod:`dispatchers.delivery.credentials`; credentials that cannot
    be opened set ``secrets_unavailable`` too); None: none."""

    def __repr__(self) -> str:  # never show secrets or payloads
        return f"Job(id={self.id}, attempts={self.attempts}, endpoint_id={self.endpoint_id})"
