"""The fields of a webhook endpoint and of its subscriptions, checked before they
are written: each check returns the value, or raises :class:`outbox.InvalidMessage`
naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from outbox.errors import InvalidMessage

MAX_DESCRIPTION = 1000
_EVENT_TYPE = re.compile(r"^[\x21-\x7e]{1,255}\Z")


def check_event_type(value: object, field: str = "event_type") -> str:
    """An event type: 1-255 printable characters, no whitespace."""
    if not isinstance(value, str) or not _EVENT_TYPE.match(value):
        raise InvalidMessage(field, "must be 1-255 printable characters without whitespace")
    if "*" in value:
        raise InvalidMessage(field, "must not contain '*'")
    return value


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
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidMessage("metadata", "must be a mapping")
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage("metadata", f"is not JSON serialisable ({exc})") from None
    return dict(metadata)


def check_max_concurrency(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000:
        raise InvalidMessage("max_concurrency", "must be an integer between 1 and 10000")
    return value


def check_description(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION:
        raise InvalidMessage("description", f"must be a string of at most {MAX_DESCRIPTION}")
    return value
