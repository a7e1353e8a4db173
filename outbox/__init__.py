"""outbox: a transactional outbox for PostgreSQL.

Write an HTTP request (or a webhook event) inside your own database transaction;
the dispatcher (``outbox dispatch``) sends it after commit, with a stable
idempotency key, retries and leases, so its remote effect happens once.
"""

from outbox.core import Outbox
from outbox.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidMessage,
    MigrationError,
    OutboxError,
)
from outbox.migrations import migrate

__all__ = [
    "ConfigurationError",
    "DatabaseUnavailable",
    "InvalidMessage",
    "MigrationError",
    "Outbox",
    "OutboxError",
    "migrate",
]
