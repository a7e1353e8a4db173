"""Retention rules: how long the delivered messages of one endpoint, or of one
event type, keep what they said.

Past a rule's period, every dispatcher's retention erases a delivered message's
body, headers and recorded answers (recording the erasure in ``expunges``); ids,
keys, times, statuses and digests stay. The shorter of two rules applies. Dead
messages in the hot table are left as they are. All functions run in the
caller's transaction and never commit.

Design: docs/explanation/design/retention-rules.md
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from outbox._arguments import check_event_type_filter, check_id
from outbox._queries import Queries, queries_for
from outbox._transaction import Plan, rows_plan, run_sync, scalar
from outbox.defaults import DEFAULT_SCHEMA
from outbox.errors import InvalidArgument

__all__ = ["MAX_PAYLOAD_RETENTION", "MIN_PAYLOAD_RETENTION", "RetentionRule", "RetentionRules"]

MIN_PAYLOAD_RETENTION = 60.0
"""The shortest period a rule may keep payloads, in seconds: a delivery whose
transaction commits late must still be found by the erasure (migration 0029)."""

MAX_PAYLOAD_RETENTION = 100 * 365 * 24 * 3600.0
"""The longest period a rule may keep payloads, in seconds (a hundred years)."""

T = TypeVar("T")


@dataclass(frozen=True)
class RetentionRule:
    """One rule, as stored: of an endpoint or of an event type (one of the two)."""

    id: int
    endpoint_id: int | None
    event_type: str | None
    #: seconds a delivered message keeps its body, headers and answers
    payload_retention_s: float
    #: every delivered message of the rule that completed before this is erased
    erased_until: datetime | None
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "id": self.id,
            "endpoint_id": self.endpoint_id,
            "event_type": self.event_type,
            "payload_retention_s": self.payload_retention_s,
            "erased_until": self.erased_until,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def check_payload_retention(value: object) -> float:
    """Seconds from :data:`MIN_PAYLOAD_RETENTION` to :data:`MAX_PAYLOAD_RETENTION`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(
            "payload_retention", f"must be a number of seconds, not {type(value).__name__}"
        )
    seconds = float(value)
    if not (math.isfinite(seconds) and MIN_PAYLOAD_RETENTION <= seconds <= MAX_PAYLOAD_RETENTION):
        raise InvalidArgument(
            "payload_retention",
            f"must be from {MIN_PAYLOAD_RETENTION:g} seconds to {MAX_PAYLOAD_RETENTION:g} seconds",
        )
    return seconds


def _selector(endpoint_id: object, event_type: object) -> dict[str, Any]:
    """The one thing a rule is about: an endpoint's id or an event type."""
    if (endpoint_id is None) == (event_type is None):
        raise InvalidArgument("endpoint_id", "give either an endpoint's id or an event type")
    if endpoint_id is not None:
        return {"endpoint_id": check_id(endpoint_id, "endpoint_id"), "event_type": None}
    return {"endpoint_id": None, "event_type": check_event_type_filter(event_type)}


class RetentionRules:
    """Manage the retention rules of ``schema``."""

    def __init__(self, *, schema: str = DEFAULT_SCHEMA) -> None:
        self.queries: Queries = queries_for(schema)

    def _run(self, tx: Any, plan: Plan[T]) -> T:
        return run_sync(tx, plan, schema=self.queries.schema)

    def set(
        self,
        tx: Any,
        *,
        payload_retention: float,
        endpoint_id: int | None = None,
        event_type: str | None = None,
    ) -> RetentionRule:
        """Keep what the delivered messages of endpoint ``endpoint_id``, or of
        event type ``event_type`` (one of the two), said for ``payload_retention``
        seconds after their delivery, replacing the rule's period if it has one.
        Raises :class:`~outbox.InvalidArgument` naming the field for a bad value
        or an endpoint that does not exist, writing nothing."""
        params = _selector(endpoint_id, event_type)
        params["payload_retention_s"] = check_payload_retention(payload_retention)
        name = (
            "retention_rule_set_endpoint"
            if endpoint_id is not None
            else ("retention_rule_set_event_type")
        )
        rows = self._run(tx, rows_plan(self.queries[name], params, RetentionRule))
        if not rows:
            raise InvalidArgument("endpoint_id", f"no endpoint {endpoint_id}")
        return rows[0]

    def get(
        self, tx: Any, *, endpoint_id: int | None = None, event_type: str | None = None
    ) -> RetentionRule | None:
        """The rule of an endpoint or of an event type (one of the two), or None."""
        params = _selector(endpoint_id, event_type)
        rows = self._run(tx, rows_plan(self.queries["retention_rule_get"], params, RetentionRule))
        return rows[0] if rows else None

    def all(self, tx: Any) -> list[RetentionRule]:
        """Every rule: endpoints' by id, then event types' by name."""
        return self._run(tx, rows_plan(self.queries["retention_rule_list"], {}, RetentionRule))

    def delete(
        self, tx: Any, *, endpoint_id: int | None = None, event_type: str | None = None
    ) -> None:
        """Drop the rule of an endpoint or of an event type: their payloads are kept
        as long as the history again (what was erased stays erased). Raises
        :class:`~outbox.InvalidArgument` naming the field if there is none."""
        params = _selector(endpoint_id, event_type)
        if not self._run(tx, rows_plan(self.queries["retention_rule_delete"], params, scalar)):
            if endpoint_id is not None:
                raise InvalidArgument("endpoint_id", f"no rule for endpoint {endpoint_id}")
            raise InvalidArgument("event_type", f"no retention rule for {event_type!r}")
