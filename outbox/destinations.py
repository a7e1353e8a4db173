"""Policies of plain destinations: a cap on the requests in flight to an origin, and
a rate limit, both enforced across every dispatcher process.

A plain message's destination is the origin of its URL, ``scheme://host:port``
(:func:`outbox._message.url_origin`); a policy names one, and a URL given here is
reduced to its origin, so that ``https://api.example.com/v1/orders`` sets the
policy of ``https://api.example.com:443``, which every message to that server
shares. A webhook endpoint's cap and rate limit are the endpoint's own
(:meth:`outbox.Endpoints.update`).

All functions run in the caller's transaction (a SQLAlchemy ``Session`` or
``Connection``, or a psycopg ``Connection``) and never commit; a policy takes
effect when that transaction commits, at every dispatcher's next claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from outbox._endpoint_fields import check_max_concurrency
from outbox._message import check_url, url_origin
from outbox._policy_fields import rate_fields
from outbox._queries import Queries, queries_for
from outbox._transaction import Plan, rows_plan, run_sync, scalar
from outbox.defaults import DEFAULT_SCHEMA
from outbox.errors import InvalidArgument, InvalidMessage


@dataclass(frozen=True)
class DestinationPolicy:
    """The policy of one plain destination, as stored: ``max_concurrency`` requests
    in flight at most, ``rate_limit_per_s`` requests per second with a ``burst``
    (None: no such bound)."""

    destination: str
    max_concurrency: int | None
    rate_limit_per_s: float | None
    burst: int | None
    created_at: datetime
    updated_at: datetime

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "destination": self.destination,
            "max_concurrency": self.max_concurrency,
            "rate_limit_per_s": self.rate_limit_per_s,
            "burst": self.burst,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


class _PolicyRow(NamedTuple):
    """A row of the ``destination_policy_*`` statements."""

    destination: str
    max_concurrency: int | None
    rate_limit_per_s: float | None
    rate_burst: int | None
    created_at: datetime
    updated_at: datetime

    def policy(self) -> DestinationPolicy:
        return DestinationPolicy(
            destination=self.destination,
            max_concurrency=self.max_concurrency,
            rate_limit_per_s=self.rate_limit_per_s,
            burst=self.rate_burst,
            created_at=self.created_at,
            updated_at=self.updated_at,
        )


class DestinationStatus(NamedTuple):
    """A row of ``status_destinations``: a destination with a policy (an origin,
    or ``endpoint:<id>``), its bounds, and its messages due now and running."""

    destination: str
    max_concurrency: int | None
    rate_limit_per_s: float | None
    burst: int | None
    ready: int
    running: int


def check_destination(value: object) -> str:
    """The origin of ``value``, an http(s) URL (any path is dropped), as messages
    name their destination; raises InvalidMessage naming ``destination``."""
    return url_origin(check_url(value, "destination"))


class Destinations:
    """Manage the policies of plain destinations in ``schema``."""

    def __init__(self, *, schema: str = DEFAULT_SCHEMA) -> None:
        self.queries: Queries = queries_for(schema)

    def set(
        self,
        tx: Any,
        destination: str,
        *,
        rate_limit: float | None = None,
        burst: int | None = None,
        max_concurrency: int | None = None,
    ) -> DestinationPolicy:
        """Set the policy of ``destination`` (a URL, reduced to its origin),
        replacing any it had: at most ``max_concurrency`` requests in flight, at
        most ``rate_limit`` requests per second with a ``burst`` (default:
        :func:`outbox._policy_fields.default_burst`). One of the two is needed;
        to remove both, :meth:`delete` the policy."""
        params = {
            "destination": check_destination(destination),
            **rate_fields(rate_limit, burst),
            "max_concurrency": check_max_concurrency(max_concurrency),
        }
        if params["rate_limit"] is None and params["max_concurrency"] is None:
            raise InvalidMessage(
                "rate_limit", "a policy needs a rate limit or a max_concurrency (or delete it)"
            )
        return run_sync(tx, self._set_plan(params), schema=self.queries.schema)

    def _set_plan(self, params: dict[str, Any]) -> Plan[DestinationPolicy]:
        rows: list[_PolicyRow] = yield self.queries["destination_policy_set"], params, _PolicyRow
        yield self.queries["destination_slots_sync"], params, None
        return rows[0].policy()

    def get(self, tx: Any, destination: str) -> DestinationPolicy | None:
        """The policy of ``destination`` (a URL, reduced to its origin), or None."""
        params = {"destination": check_destination(destination)}
        rows = run_sync(
            tx,
            rows_plan(self.queries["destination_policy_get"], params, _PolicyRow),
            schema=self.queries.schema,
        )
        return rows[0].policy() if rows else None

    def require(self, tx: Any, destination: str) -> DestinationPolicy:
        """The policy; raises InvalidArgument naming ``destination`` if there is none."""
        found = self.get(tx, destination)
        if found is None:
            raise InvalidArgument("destination", f"no policy for {check_destination(destination)}")
        return found

    def all(self, tx: Any) -> list[DestinationPolicy]:
        """Every policy, by destination."""
        rows = run_sync(
            tx,
            rows_plan(self.queries["destination_policy_list"], {}, _PolicyRow),
            schema=self.queries.schema,
        )
        return [r.policy() for r in rows]

    def delete(self, tx: Any, destination: str) -> str:
        """Remove the policy of ``destination`` (its messages go unbounded from the
        next claim); return the origin. Raises InvalidArgument if it had none."""
        return run_sync(
            tx, self._delete_plan(check_destination(destination)), schema=self.queries.schema
        )

    def _delete_plan(self, origin: str) -> Plan[str]:
        params = {"destination": origin}
        removed = yield self.queries["destination_policy_delete"], params, scalar
        if not removed:
            raise InvalidArgument("destination", f"no policy for {origin}")
        yield self.queries["destination_slots_sync"], params, None
        return origin
