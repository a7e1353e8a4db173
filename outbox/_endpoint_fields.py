"""The fields of a webhook endpoint and of its subscriptions, checked before they
are written: each check returns the value, or raises :class:`outbox.InvalidMessage`
naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from outbox._storable import check_json, check_text
from outbox.errors import InvalidMessage

MAX_DESCRIPTION = 1000
MAX_METADATA_BYTES = 64 * 1024
"""The most an endpoint's metadata may take, as JSON: notes about the endpoint,
not data."""
_EVENT_TYPE = re.compile(r"^[\x21-\x7e]{1,255}\Z")
_TENANT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}\Z")


def check_tenant_id(value: object, field: str = "tenant") -> str:
    """A tenant's external id: 1-128 letters, digits and ``._:@-``, starting
    with a letter or digit (the rule of migration 0024, and of SQL ``publish``)."""
    if not isinstance(value, str) or not _TENANT_ID.match(value):
        raise InvalidMessage(
            field, "must be 1-128 letters, digits and ._:@- starting with a letter or digit"
        )
    return value


def check_event_type(value: object, field: str = "event_type") -> str:
    """An event type: 1-255 printable characters, no whitespace."""
    if not isinstance(value, str) or not _EVENT_TYPE.match(value):
        raise InvalidMessage(field, "must be 1-255 printable characters without whitespace")
    if "*" in value:
        raise InvalidMessage(field, "must not contain '*'")
    return value


RESERVED_PREFIX = "outbox."
"""The prefix of the outbox's own event types: its alerts (migration 0028) and
test events. An application publishes none of them."""


def check_published_type(value: object) -> str:
    """The type of an event an application publishes: an event type
    (:func:`check_event_type`) that is not one of the outbox's own."""
    event_type = check_event_type(value)
    if event_type.startswith(RESERVED_PREFIX):
        raise InvalidMessage(
            "event_type",
            f"must not start with {RESERVED_PREFIX!r}, the prefix of the outbox's own "
            "events (alerts, test events)",
        )
    return event_type


def check_subscriptions(values: object) -> list[str]:
    """Event type subscriptions: exact types or ``prefix.*`` patterns; empty = all."""
    if values is None:
        return []
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise InvalidMessage("event_types", "must be a list of event types")
    out: list[str] = []
    for value in values:
        if isinstance(value, str) and value.endswith(".*") and len(value) > 2:
            check_event_type(value[:-2], "event_types")
        else:
            check_event_type(value, "event_types")
        if value not in out:
            out.append(value)
    return out


def check_metadata(metadata: object) -> dict[str, Any]:
    """A mapping that is JSON PostgreSQL stores as ``jsonb``: at most
    :data:`~outbox._storable.MAX_JSON_DEPTH` deep, no NUL character nor lone
    surrogate in a key or string, at most :data:`MAX_METADATA_BYTES` encoded."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidMessage("metadata", "must be a mapping")
    value = dict(metadata)
    check_json(value, "metadata", max_values=MAX_METADATA_BYTES // 2 + 2)
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage("metadata", f"is not JSON serialisable ({exc})") from None
    if len(encoded.encode()) > MAX_METADATA_BYTES:
        raise InvalidMessage("metadata", f"is more than {MAX_METADATA_BYTES:,} bytes of JSON")
    return value


def check_max_concurrency(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
        raise InvalidMessage("max_concurrency", "must be an integer between 1 and 10000")
    return value


def check_description(value: object, field: str = "description") -> str:
    """Free text of at most :data:`MAX_DESCRIPTION` characters that PostgreSQL
    can store (the description, and the reason an endpoint was disabled)."""
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION:
        raise InvalidMessage(field, f"must be a string of at most {MAX_DESCRIPTION} characters")
    return check_text(value, field)
