"""A claimed message for tests that drive the sender or the dispatcher without
claiming one from the database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dispatchers.delivery.jobs import Job


def job(**overrides: Any) -> Job:
    """Message 7's first attempt, a small JSON POST; ``overrides`` replace fields."""
    fields: dict[str, Any] = {
        "id": 7,
        "idempotency_key": "order-7",
        "url": "https://example.com/hook",
        "method": "POST",
        "headers": {"X-Tenant": "acme"},
        "body": b'{"n":7}',
        "content_type": "application/json",
        "attempts": 1,
        "max_attempts": 3,
        "endpoint_id": None,
        "event_type": None,
        "created_at": datetime.now(UTC),
        "destination": "https://example.com:443",
    }
    fields.update(overrides)
    return Job(**fields)
