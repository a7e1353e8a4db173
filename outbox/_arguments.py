"""Checks of the operator functions' arguments (:mod:`outbox.admin`): each returns
the value, or raises :class:`outbox.InvalidArgument` naming the argument."""

from __future__ import annotations

from datetime import datetime

from outbox._endpoint_fields import check_event_type
from outbox._message import MAX_ATTEMPTS_LIMIT
from outbox.errors import InvalidArgument, InvalidMessage

MAX_ID = 2**63 - 1
"""The largest id of a row: PostgreSQL's largest ``bigint``."""


def check_id(value: object, field: str) -> int:
    """An id, checked before it reaches a statement (where one past ``bigint`` is an
    error that aborts the caller's transaction)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer, not {type(value).__name__}")
    if not 1 <= value <= MAX_ID:
        raise InvalidArgument(field, f"must be from 1 to {MAX_ID}")
    return value


def check_event_type_filter(value: object) -> str:
    """An event type to filter by: the rule of an event's type, for an argument."""
    try:
        return check_event_type(value)
    except InvalidMessage as exc:
        raise InvalidArgument(exc.field, exc.problem) from None


def check_since(value: object, field: str = "since") -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidArgument(field, "must be a timezone-aware datetime")
    return value


def check_budget(value: object, field: str = "budget") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(field, f"must be an integer, not {type(value).__name__}")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument(field, f"must be between 1 and {MAX_ATTEMPTS_LIMIT}")
    return value
