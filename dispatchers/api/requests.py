"""What the management API accepts: the pydantic models of each request's path,
query and body (what it answers is :mod:`~dispatchers.api.responses`).

The handlers validate every request with these models before anything runs,
and :mod:`~dispatchers.api.openapi` builds the OpenAPI document from their JSON
Schemas: one definition serves both, so the document cannot say what the
handlers do not check. The bounds are the library's own
(:mod:`outbox.internal`); what a model cannot express (a URL's host, a filter's
grammar, a secret's encoding) the library checks next, naming the field as
these do. Input models forbid fields they do not know. A field of an update
that is absent keeps its value; one given as ``null`` clears it, where it may
be cleared. What a model accepts is what its schema allows
(:mod:`~dispatchers.api.bases`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BeforeValidator, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from dispatchers.api.bases import (
    INSTANT_PATTERN,
    INTEGRAL,
    Input,
    Parameters,
    parse_instant,
)
from dispatchers.api.cursors import DEFAULT_LIMIT, MAX_CURSOR, MAX_LIMIT
from outbox.defaults import MAX_RETRY_DELAY, MAX_RETRY_SCHEDULE, MAX_SPAN
from outbox.internal import (
    MAX_ATTEMPTS_LIMIT,
    MAX_BURST,
    MAX_DESCRIPTION,
    MAX_FILTER_LENGTH,
    MAX_ID,
    MAX_KEY_LENGTH,
    MAX_RATE_LIMIT,
    MAX_URL_LENGTH,
    MIN_RATE_LIMIT,
)
from outbox.portal import DEFAULT_EXPIRY, MAX_EXPIRY, MIN_EXPIRY
from outbox.retention_rules import MAX_PAYLOAD_RETENTION, MIN_PAYLOAD_RETENTION

MAX_IDS = 10_000
"""The most message ids one request names."""

MAX_SUBSCRIPTIONS = 1000
"""The most event types one endpoint subscribes to through the API."""

Id = Annotated[int, Field(ge=1, le=MAX_ID, description="a row's id"), INTEGRAL]
Instant = Annotated[
    AwareDatetime,
    BeforeValidator(parse_instant),
    Field(
        description="an RFC 3339 date-time with Z or an offset, from 1970 to 9998",
        json_schema_extra={"pattern": INSTANT_PATTERN},
    ),
]
EventTypeName = Annotated[
    str,
    Field(
        pattern=r"^[!-)+-~]{1,255}$",
        description="1-255 printable ASCII characters, no whitespace, no '*'",
    ),
]
Subscription = Annotated[
    str,
    Field(
        pattern=r"^[!-)+-~]{1,255}(\.\*)?$",
        description="an event type, or a prefix followed by '.*'",
    ),
]
Url = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        pattern=r"^[Hh][Tt][Tt][Pp][Ss]?://[!-~]+$",
        description="an absolute http(s) URL without credentials",
    ),
]
Description = Annotated[str, Field(max_length=MAX_DESCRIPTION)]
Metadata = Annotated[dict[str, Any], Field(description="a JSON object, at most 64 KiB")]
MaxConcurrency = Annotated[int, Field(ge=1, le=10_000), INTEGRAL]
RateLimit = Annotated[
    float, Field(ge=MIN_RATE_LIMIT, le=MAX_RATE_LIMIT, description="requests per second")
]
Burst = Annotated[int, Field(ge=1, le=MAX_BURST), INTEGRAL]
Filter = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_FILTER_LENGTH,
        description="a JMESPath expression on the payload; an operator's token's only "
        "(a tenant's is refused: 403)",
    ),
]
RetrySchedule = Annotated[
    list[Annotated[float, Field(gt=0, le=MAX_RETRY_DELAY)]],
    Field(
        min_length=1,
        max_length=MAX_RETRY_SCHEDULE,
        description="seconds before each retry; the last repeats",
    ),
]
Budget = Annotated[int, Field(ge=1, le=MAX_ATTEMPTS_LIMIT, description="attempts"), INTEGRAL]
SigningSecret = Annotated[
    str, Field(pattern=r"^whsec_[A-Za-z0-9+/=]{32,88}$", description="whsec_ and base64")
]
TenantId = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$",
        description="a tenant's external id",
    ),
]
Cursor = Annotated[str, Field(min_length=1, max_length=MAX_CURSOR, description="from next_cursor")]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description="rows per page"), INTEGRAL]
MessageState = Literal["ready", "running", "paused", "dead", "delivered"]


# -- pages -------------------------------------------------------------------------


class PageQuery(Parameters):
    cursor: Cursor | SkipJsonSchema[None] = None
    limit: Limit = DEFAULT_LIMIT


# -- path parameters ---------------------------------------------------------------


class IdPath(Parameters):
    id: Id


class EventTypePath(Parameters):
    event_type: EventTypeName


class TenantPath(Parameters):
    external_id: TenantId


# -- tokens, problems ------------------------------------------------------------------


# -- endpoints ---------------------------------------------------------------------


class EndpointQuery(PageQuery):
    tenant: TenantId | SkipJsonSchema[None] = None
    enabled: bool | SkipJsonSchema[None] = None


class EndpointCreate(Input):
    url: Url
    event_types: list[Subscription] = Field(default_factory=list, max_length=MAX_SUBSCRIPTIONS)
    description: Description = ""
    metadata: Metadata = Field(default_factory=dict)
    max_concurrency: MaxConcurrency | SkipJsonSchema[None] = None
    rate_limit: RateLimit | SkipJsonSchema[None] = None
    burst: Burst | SkipJsonSchema[None] = None
    filter: Filter | SkipJsonSchema[None] = None
    retry_schedule: RetrySchedule | SkipJsonSchema[None] = None
    secret: SigningSecret | SkipJsonSchema[None] = None
    tenant: TenantId | SkipJsonSchema[None] = None


class EndpointUpdate(Input):
    url: Url | SkipJsonSchema[None] = None
    event_types: (
        Annotated[list[Subscription], Field(max_length=MAX_SUBSCRIPTIONS)] | SkipJsonSchema[None]
    ) = None
    description: Description | SkipJsonSchema[None] = None
    metadata: Metadata | SkipJsonSchema[None] = None
    max_concurrency: MaxConcurrency | None = None
    rate_limit: RateLimit | None = None
    burst: Burst | SkipJsonSchema[None] = None
    filter: Filter | None = None
    retry_schedule: RetrySchedule | None = None

    @classmethod
    def clearable(cls) -> frozenset[str]:
        return frozenset({"max_concurrency", "rate_limit", "filter", "retry_schedule"})


class EndpointDisable(Input):
    reason: Annotated[str, Field(min_length=1, max_length=MAX_DESCRIPTION)] = (
        "disabled by an operator"
    )


class SecretRotate(Input):
    secret: SigningSecret | SkipJsonSchema[None] = None
    overlap_hours: Annotated[float, Field(ge=0, le=MAX_SPAN / 3600)] = 24.0


# -- event types -------------------------------------------------------------------


class EventTypeSet(Input):
    retry_schedule: RetrySchedule


# -- messages ----------------------------------------------------------------------


class MessageQuery(PageQuery):
    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH)] | SkipJsonSchema[None] = (
        None
    )
    event_type: EventTypeName | SkipJsonSchema[None] = None
    endpoint_id: Id | SkipJsonSchema[None] = None
    tenant: TenantId | SkipJsonSchema[None] = None
    state: MessageState | SkipJsonSchema[None] = None
    created_from: Instant | SkipJsonSchema[None] = None
    created_until: Instant | SkipJsonSchema[None] = None


class MessageReplay(Input):
    budget: Budget = 8


# -- dead letters ------------------------------------------------------------------


class DeadQuery(PageQuery):
    endpoint_id: Id | SkipJsonSchema[None] = None
    event_type: EventTypeName | SkipJsonSchema[None] = None
    since: Instant | SkipJsonSchema[None] = None
    tenant: TenantId | SkipJsonSchema[None] = None


class DeadSelection(Input):
    """Dead messages to act on: by ids, by filters (all given must match), or
    ``all``; never by default."""

    ids: Annotated[list[Id], Field(min_length=1, max_length=MAX_IDS)] | SkipJsonSchema[None] = None
    endpoint_id: Id | SkipJsonSchema[None] = None
    event_type: EventTypeName | SkipJsonSchema[None] = None
    since: Instant | SkipJsonSchema[None] = None
    all: bool = False

    @model_validator(mode="after")
    def _one_selection(self) -> DeadSelection:
        narrowed = any(
            v is not None for v in (self.ids, self.endpoint_id, self.event_type, self.since)
        )
        if self.all and narrowed:
            raise ValueError("all: cannot be combined with ids or filters")
        if not self.all and not narrowed:
            raise ValueError("ids: give ids, a filter (endpoint_id, event_type, since) or all")
        return self


class DeadRetry(DeadSelection):
    budget: Budget | SkipJsonSchema[None] = None


# -- replay ------------------------------------------------------------------------


class ReplayRequest(Input):
    """A window of an endpoint's delivered messages (``since``, ``until``), or
    one recorded event (``event_key``) sent to it."""

    endpoint_id: Id
    since: Instant | SkipJsonSchema[None] = None
    until: Instant | SkipJsonSchema[None] = None
    event_key: (
        Annotated[str, Field(min_length=1, max_length=MAX_KEY_LENGTH)] | SkipJsonSchema[None]
    ) = None
    budget: Budget = 8

    @model_validator(mode="after")
    def _window_or_event(self) -> ReplayRequest:
        if self.event_key is not None and (self.since is not None or self.until is not None):
            raise ValueError("event_key: sends one event, with no since or until")
        if self.event_key is None and self.since is None:
            raise ValueError("since: give since (a window) or event_key")
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError("until: must be later than since")
        return self


# -- destination policies ----------------------------------------------------------


class DestinationQuery(Parameters):
    destination: Url


class DestinationSet(Input):
    destination: Url
    rate_limit: RateLimit | SkipJsonSchema[None] = None
    burst: Burst | SkipJsonSchema[None] = None
    max_concurrency: MaxConcurrency | SkipJsonSchema[None] = None


# -- status, audit -----------------------------------------------------------------


# -- tenants -----------------------------------------------------------------------


class TenantCreate(Input):
    external_id: TenantId
    name: Annotated[str, Field(max_length=200)] = ""
    metadata: Metadata = Field(default_factory=dict)
    rate_limit: RateLimit | SkipJsonSchema[None] = None
    burst: Burst | SkipJsonSchema[None] = None
    retry_schedule: RetrySchedule | SkipJsonSchema[None] = None


class RetentionRuleSet(Input):
    """The rule of one endpoint or of one event type: give exactly one."""

    endpoint_id: Id | SkipJsonSchema[None] = None
    event_type: EventTypeName | SkipJsonSchema[None] = None
    payload_retention_s: Annotated[
        float,
        Field(
            ge=MIN_PAYLOAD_RETENTION,
            le=MAX_PAYLOAD_RETENTION,
            description="seconds a delivered message keeps its payload, a minute at least",
        ),
    ]


class RetentionRuleQuery(Parameters):
    """The rule to drop: of one endpoint or of one event type."""

    endpoint_id: Id | SkipJsonSchema[None] = None
    event_type: EventTypeName | SkipJsonSchema[None] = None


class PortalLinkCreate(Input):
    expires_in_s: Annotated[
        float,
        Field(
            ge=MIN_EXPIRY.total_seconds(),
            le=MAX_EXPIRY.total_seconds(),
            description="seconds the link works, from a minute to 30 days",
        ),
    ] = DEFAULT_EXPIRY.total_seconds()


class TenantUpdate(Input):
    name: Annotated[str, Field(max_length=200)] | SkipJsonSchema[None] = None
    metadata: Metadata | SkipJsonSchema[None] = None
    rate_limit: RateLimit | None = None
    burst: Burst | SkipJsonSchema[None] = None
    retry_schedule: RetrySchedule | None = None

    @classmethod
    def clearable(cls) -> frozenset[str]:
        return frozenset({"rate_limit", "retry_schedule"})
