"""What the management API answers, as pydantic models: each route's answer
is one of them, dumped as JSON, and the OpenAPI document describes it by the
same model's schema (see :mod:`~dispatchers.api.requests` for what it accepts).
Signing secrets appear only in the answers of the routes that make one
(:class:`EndpointCreated`, :class:`SecretRotated`); elsewhere, by fingerprint.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from dispatchers.api.bases import Output
from dispatchers.api.tokens import MAX_NAME


class TokenOut(Output):
    """The token a request was made with."""

    id: int
    name: str = Field(max_length=MAX_NAME)
    scope: Literal["read", "write"]
    tenant: str | None


class FieldProblem(Output):
    field: str
    problem: str


class ProblemOut(Output):
    """RFC 9457 problem details: what was refused and why, naming the field at
    fault when one is."""

    type: str
    title: str
    status: int
    detail: str
    instance: str
    field: str | None = None
    errors: list[FieldProblem] | None = None


class SecretOut(Output):
    """A signing secret, by its fingerprint (None: sealed under a key this
    server was not given)."""

    fingerprint: str | None
    key_id: str | None
    expires_at: datetime | None


class EndpointOut(Output):
    id: int
    url: str
    description: str
    event_types: list[str]
    metadata: dict[str, Any]
    enabled: bool
    disabled_reason: str | None
    disabled_at: datetime | None
    failure_streak: int
    failing_since: datetime | None
    last_success_at: datetime | None
    max_concurrency: int | None
    rate_limit_per_s: float | None
    burst: int | None
    filter: str | None
    retry_schedule: list[float] | None
    tenant: str | None
    secrets: list[SecretOut]
    header_names: list[str]
    auth_scheme: str | None
    created_at: datetime
    updated_at: datetime


class EndpointCreated(EndpointOut):
    secret: str = Field(description="the signing secret, shown here only")


class EndpointPage(Output):
    items: list[EndpointOut]
    next_cursor: str | None


class EndpointDisabled(Output):
    endpoint: EndpointOut
    paused: int


class EndpointEnabled(Output):
    endpoint: EndpointOut
    resumed: int


class EndpointDeleted(Output):
    id: int
    messages: int = Field(description="its messages in the outbox; the waiting ones died")


class SecretRotated(Output):
    id: int
    secret: str = Field(description="the new signing secret, shown here only")
    previous_secrets_expire_at: datetime | None


class TestSent(Output):
    endpoint_id: int
    message_id: int


class EventTypeOut(Output):
    event_type: str
    retry_schedule: list[float]
    created_at: datetime
    updated_at: datetime


class EventTypeList(Output):
    items: list[EventTypeOut]


class EventTypeDeleted(Output):
    event_type: str


class MessageSummary(Output):
    id: int
    idempotency_key: str
    url: str | None
    endpoint_id: int | None
    event_type: str | None
    state: str
    attempts: int
    last_status: int | None
    created_at: datetime


class MessagePage(Output):
    items: list[MessageSummary]
    next_cursor: str | None


class AttemptOut(Output):
    attempt: int
    owner: str | None = Field(
        description="the dispatcher that made it (host name and pid); null to a tenant's token"
    )
    started_at: datetime
    duration_ms: int | None
    status: int | None
    outcome: str
    error_class: str | None
    error: str | None
    response_excerpt: str | None


class MessageOut(Output):
    """A message with its attempts; its header names but not their values, and
    its body's size but not the body."""

    id: int
    idempotency_key: str
    endpoint_id: int | None
    url: str | None
    method: str
    header_names: list[str]
    content_type: str
    body_bytes: int
    event_type: str | None
    ordering_key: str | None
    state: str
    attempts: int
    max_attempts: int
    available_at: datetime | None
    last_status: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None
    attempt_log: list[AttemptOut]


class MessageReplayed(Output):
    id: int
    replayed: bool = Field(description="False if no delivered message has this id")


class DeadOut(Output):
    id: int
    idempotency_key: str
    url: str | None
    endpoint_id: int | None
    event_type: str | None
    attempts: int
    max_attempts: int
    last_status: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None


class DeadPage(Output):
    items: list[DeadOut]
    next_cursor: str | None


class DeadRetried(Output):
    retried: int
    missing: list[int] = Field(description="ids given that name no dead message")


class DeadPurged(Output):
    purged: int
    missing: list[int] = Field(description="ids given that name no dead message")


class ReplayResult(Output):
    endpoint_id: int
    replayed: int | None = Field(description="messages of the window sent again")
    message_id: int | None = Field(description="the event's message to the endpoint")
    created: bool | None = Field(description="False if the endpoint had the event already")


class DestinationOut(Output):
    destination: str
    max_concurrency: int | None
    rate_limit_per_s: float | None
    burst: int | None
    created_at: datetime
    updated_at: datetime


class DestinationList(Output):
    items: list[DestinationOut]


class DestinationDeleted(Output):
    destination: str


class StatusEndpoint(Output):
    id: int
    url: str
    enabled: bool
    disabled_reason: str | None
    failure_streak: int
    pending: int
    dead: int
    last_success_at: datetime | None


class StatusDestination(Output):
    destination: str
    max_concurrency: int | None
    rate_limit_per_s: float | None
    burst: int | None
    ready: int
    running: int


class StatusHealth(Output):
    destination: str
    state: str
    blocked_until: datetime
    failed_probes: int
    opened_at: datetime | None
    reason: str | None


class StatusSecrets(Output):
    plain_text: int
    sealed: dict[str, int]


class StatusOut(Output):
    messages: dict[str, int]
    oldest_ready_age_s: float | None
    last_5_minutes: dict[str, int]
    endpoints: list[StatusEndpoint]
    destinations: list[StatusDestination]
    destination_health: list[StatusHealth]
    secrets: StatusSecrets
    now: datetime


class AuditOut(Output):
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


class AuditPage(Output):
    items: list[AuditOut]
    next_cursor: str | None


class TenantOut(Output):
    """A tenant; its rate limit and retry schedule are the defaults of the
    endpoints added to it."""

    external_id: str
    name: str
    metadata: dict[str, Any]
    rate_limit_per_s: float | None
    burst: int | None
    retry_schedule: list[float] | None
    endpoints: int
    created_at: datetime
    updated_at: datetime


class TenantPage(Output):
    items: list[TenantOut]
    next_cursor: str | None


class RetentionRuleOut(Output):
    """A retention rule: the payloads of its endpoint's, or its event type's,
    delivered messages are erased ``payload_retention_s`` after delivery."""

    id: int
    endpoint_id: int | None
    event_type: str | None
    payload_retention_s: float
    erased_until: datetime | None = Field(
        description="every delivered message of the rule completed before this is erased"
    )
    created_at: datetime
    updated_at: datetime


class RetentionRuleList(Output):
    items: list[RetentionRuleOut]


class RetentionRuleDeleted(Output):
    endpoint_id: int | None
    event_type: str | None


class PortalLinkOut(Output):
    """A link to a tenant's consumer portal, just made. Its token is shown here
    once (the database keeps its digest); the portal is served at ``url_path``
    by the same ``outbox ui`` as this API, unless it runs with ``--api-only``."""

    id: int
    tenant: str
    url_path: str
    token: str
    expires_at: datetime


class PortalLinksRevoked(Output):
    tenant: str
    revoked: int = Field(description="the links that worked until now")


class TenantDeleted(Output):
    external_id: str
    endpoints: int = Field(description="its endpoints, deleted with it")
    messages: int = Field(description="their messages in the outbox; the waiting ones died")
