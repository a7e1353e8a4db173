"""Event types' settings: the retry schedule of an event type's webhooks.

An endpoint's own schedule comes first; an event type's applies to the webhooks
of that type whose endpoint has none; without either, the dispatcher's default
schedule does. Dispatchers read it as they claim, so a change applies to the
next retry scheduled, by every dispatcher alike.

All functions run in the caller's transaction (a SQLAlchemy ``Session`` or
``Connection``, or a psycopg ``Connection``) and never commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox._arguments import check_event_type_filter
from outbox._queries import Queries, queries_for
from outbox._retry_schedule import check_retry_schedule
from outbox._transaction import rows_plan, run_sync, scalar
from outbox.defaults import DEFAULT_SCHEMA
from outbox.errors import InvalidArgument, InvalidMessage

__all__ = ["EventType", "EventTypes"]


@dataclass(frozen=True)
class EventType:
    """One event type's settings, as stored."""

    event_type: str
    retry_schedule: list[float]
    """Seconds before each retry of its webhooks (the last repeats)."""
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "event_type": self.event_type,
            "retry_schedule": self.retry_schedule,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def _schedule(value: object) -> list[float]:
    """The rule of an endpoint's schedule, for an argument: an event type's is not
    part of a message, so a bad one is an :class:`~outbox.InvalidArgument` itself."""
    try:
        schedule = check_retry_schedule(value)
    except InvalidMessage as exc:
        raise InvalidArgument(exc.field, exc.problem) from None
    if schedule is None:
        raise InvalidArgument("retry_schedule", "must be a list of delays in seconds")
    return schedule


class EventTypes:
    """Manage event types' settings in ``schema``."""

    def __init__(self, *, schema: str = DEFAULT_SCHEMA) -> None:
        self.queries: Queries = queries_for(schema)

    def set(self, tx: Any, event_type: str, *, retry_schedule: Iterable[float]) -> EventType:
        """Give ``event_type`` the retry schedule ``retry_schedule`` (replacing the
        one it had): the seconds before each retry, the last repeating."""
        params = {
            "event_type": check_event_type_filter(event_type),
            "retry_schedule": _schedule(retry_schedule),
        }
        (row,) = run_sync(
            tx,
            rows_plan(self.queries["event_type_set"], params, EventType),
            schema=self.queries.schema,
        )
        return row

    def get(self, tx: Any, event_type: str) -> EventType | None:
        """The event type's settings, or None if it has none."""
        params = {"event_type": check_event_type_filter(event_type)}
        rows = run_sync(
            tx,
            rows_plan(self.queries["event_type_get"], params, EventType),
            schema=self.queries.schema,
        )
        return rows[0] if rows else None

    def all(self, tx: Any) -> list[EventType]:
        """Every event type with settings, by name."""
        return run_sync(
            tx,
            rows_plan(self.queries["event_type_list"], {}, EventType),
            schema=self.queries.schema,
        )

    def delete(self, tx: Any, event_type: str) -> None:
        """Drop the event type's settings: its webhooks follow the default schedule
        again. Raises :class:`~outbox.InvalidArgument` naming ``event_type`` if it
        has none."""
        params = {"event_type": check_event_type_filter(event_type)}
        if not run_sync(
            tx,
            rows_plan(self.queries["event_type_delete"], params, scalar),
            schema=self.queries.schema,
        ):
            raise InvalidArgument("event_type", f"no settings for event type {event_type!r}")
