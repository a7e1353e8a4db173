"""outbox: a transactional outbox for PostgreSQL.

Write an HTTP request (or a webhook event) inside your own database transaction;
the dispatcher (``outbox dispatch``) sends it after commit, with a stable
idempotency key, retries and leases, so its remote effect happens once.

The public API is named here. Operator functions (dead letters, replay, status)
are in :mod:`outbox.admin`; the receiving half (:class:`Inbox`, :func:`verify`,
:func:`idempotency_key`) is also :mod:`outbox.receiver`. Modules whose names start
with an underscore are internal and may change without notice.
"""

from outbox._core import Outbox
from outbox.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_SCHEMA, DEFAULT_WEBHOOK_MAX_ATTEMPTS
from outbox.destinations import DestinationPolicy, Destinations
from outbox.endpoints import Endpoint, Endpoints, OAuth2ClientCredentials
from outbox.errors import (
    ConfigurationError,
    IdempotencyKeyReused,
    InvalidArgument,
    InvalidMessage,
    InvalidSignature,
    MigrationError,
    OutboxError,
    SchemaNotMigrated,
)
from outbox.event_types import EventType, EventTypes
from outbox.migrations import migrate
from outbox.receiver import Inbox, idempotency_key, verify
from outbox.retention_rules import RetentionRule, RetentionRules
from outbox.tenants import Tenant, Tenants

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_SCHEMA",
    "DEFAULT_WEBHOOK_MAX_ATTEMPTS",
    "ConfigurationError",
    "DestinationPolicy",
    "Destinations",
    "Endpoint",
    "Endpoints",
    "EventType",
    "EventTypes",
    "IdempotencyKeyReused",
    "Inbox",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidSignature",
    "MigrationError",
    "OAuth2ClientCredentials",
    "Outbox",
    "OutboxError",
    "RetentionRule",
    "RetentionRules",
    "SchemaNotMigrated",
    "Tenant",
    "Tenants",
    "idempotency_key",
    "migrate",
    "verify",
]
