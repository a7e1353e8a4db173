"""Tenants: the customers of a product that sends them webhooks.

A tenant is named by an external id that the product chooses (``"customer-17"``)
and owns endpoints (``Endpoints.add(..., tenant="customer-17")``). An event
published with ``tenant=`` goes to that tenant's subscribed endpoints only, and
its key is the tenant's own; one published without goes to the endpoints of no
tenant, never to a tenant's. A tenant's rate limit and retry schedule are the
defaults of the endpoints added to it: copied when an endpoint is created, so
changing them later changes no existing endpoint.

All functions run in the caller's transaction (a SQLAlchemy ``Session`` or
``Connection``, or a psycopg ``Connection``) and never commit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from outbox._endpoint_fields import check_metadata, check_tenant_id
from outbox._endpoint_rows import json_value
from outbox._policy_fields import rate_fields
from outbox._queries import Queries, queries_for
from outbox._retry_schedule import check_retry_schedule
from outbox._storable import check_text
from outbox._transaction import Plan, run_sync, scalar
from outbox.defaults import DEFAULT_SCHEMA
from outbox.endpoints import Endpoints
from outbox.errors import InvalidArgument, InvalidMessage

__all__ = ["MAX_TENANT_PAGE", "Tenant", "TenantDeleted", "Tenants"]

MAX_TENANT_PAGE = 1000
"""The most tenants :meth:`Tenants.all` returns per call."""

MAX_NAME = 200
"""The longest name a tenant may have, in characters."""

T = TypeVar("T")


@dataclass(frozen=True)
class Tenant:
    """One tenant, as stored."""

    external_id: str
    name: str
    metadata: dict[str, Any]
    #: the defaults of the endpoints added to it (see :mod:`outbox.destinations`)
    rate_limit_per_s: float | None
    burst: int | None
    retry_schedule: list[float] | None
    created_at: datetime
    updated_at: datetime
    #: how many endpoints it has
    endpoints: int
    #: its key in the database (endpoints.tenant_id, events.tenant_id)
    id: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        return {
            "id": self.external_id,
            "name": self.name,
            "metadata": self.metadata,
            "rate_limit_per_s": self.rate_limit_per_s,
            "burst": self.burst,
            "retry_schedule": self.retry_schedule,
            "endpoints": self.endpoints,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


class _TenantRow(NamedTuple):
    """A row of ``tenant_get`` and ``tenant_list``."""

    id: int
    external_id: str
    name: str
    metadata: Any  # jsonb: a dict, or its text from drivers that do not decode jsonb
    rate_limit_per_s: float | None
    rate_burst: int | None
    retry_schedule: list[float] | None
    created_at: datetime
    updated_at: datetime
    endpoints: int

    def tenant(self) -> Tenant:
        return Tenant(
            external_id=self.external_id,
            name=self.name,
            metadata=json_value(self.metadata),
            rate_limit_per_s=self.rate_limit_per_s,
            burst=self.rate_burst,
            retry_schedule=None if self.retry_schedule is None else list(self.retry_schedule),
            created_at=self.created_at,
            updated_at=self.updated_at,
            endpoints=self.endpoints,
            id=self.id,
        )


class TenantDeleted(NamedTuple):
    """What :meth:`Tenants.delete` removed: the tenant's endpoints, and how many
    of their waiting messages became dead."""

    endpoints: int
    messages: int


def _check_name(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise InvalidMessage("name", f"must be a string of at most {MAX_NAME} characters")
    return check_text(value, "name")


class Tenants:
    """Manage the tenants of ``schema``."""

    def __init__(self, *, schema: str = DEFAULT_SCHEMA) -> None:
        self.queries: Queries = queries_for(schema)

    def _run(self, tx: Any, plan: Plan[T]) -> T:
        return run_sync(tx, plan, schema=self.queries.schema)

    def add(
        self,
        tx: Any,
        external_id: str,
        *,
        name: str = "",
        metadata: Mapping[str, Any] | None = None,
        rate_limit: float | None = None,
        burst: int | None = None,
        retry_schedule: Iterable[float] | None = None,
    ) -> Tenant:
        """Create a tenant; an external id taken already is refused naming
        ``external_id``, and nothing is written."""
        params = {
            "external_id": check_tenant_id(external_id, "external_id"),
            "name": _check_name(name),
            "metadata": json.dumps(check_metadata(metadata)),
            **rate_fields(rate_limit, burst),
            "retry_schedule": check_retry_schedule(retry_schedule),
        }
        return self._run(tx, self._insert_plan(params))

    def _insert_plan(self, params: dict[str, Any]) -> Plan[Tenant]:
        ids: list[int] = yield self.queries["tenant_insert"], params, scalar
        if not ids:
            raise InvalidArgument(
                "external_id", f"a tenant with id {params['external_id']!r} exists already"
            )
        return (yield from self._require_plan(params["external_id"]))

    def get(self, tx: Any, external_id: str) -> Tenant | None:
        """The tenant, or None if there is no such external id."""
        return self._run(tx, self._get_plan(check_tenant_id(external_id, "external_id")))

    def _get_plan(self, external_id: str) -> Plan[Tenant | None]:
        rows: list[_TenantRow] = yield (
            self.queries["tenant_get"],
            {"external_id": external_id},
            _TenantRow,
        )
        return rows[0].tenant() if rows else None

    def _require_plan(self, external_id: str) -> Plan[Tenant]:
        found = yield from self._get_plan(external_id)
        if found is None:
            raise InvalidArgument("external_id", f"no tenant with id {external_id!r}")
        return found

    def require(self, tx: Any, external_id: str) -> Tenant:
        """The tenant; raises InvalidArgument naming ``external_id`` if absent."""
        return self._run(tx, self._require_plan(check_tenant_id(external_id, "external_id")))

    def all(
        self, tx: Any, *, after: str | None = None, limit: int = MAX_TENANT_PAGE
    ) -> list[Tenant]:
        """Tenants by external id: at most ``limit``, those after ``after`` (the
        last external id of the previous page)."""
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_TENANT_PAGE
        ):
            raise InvalidArgument("limit", f"must be an integer from 1 to {MAX_TENANT_PAGE}")
        params = {
            "after": None if after is None else check_tenant_id(after, "after"),
            "limit": limit,
        }
        return self._run(tx, self._list_plan(params))

    def _list_plan(self, params: dict[str, Any]) -> Plan[list[Tenant]]:
        rows: list[_TenantRow] = yield self.queries["tenant_list"], params, _TenantRow
        return [row.tenant() for row in rows]

    def update(
        self,
        tx: Any,
        external_id: str,
        *,
        name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        rate_limit: float | None = None,
        burst: int | None = None,
        clear_rate_limit: bool = False,
        retry_schedule: Iterable[float] | None = None,
        clear_retry_schedule: bool = False,
    ) -> Tenant:
        """Change the given fields; the others keep their value. The defaults
        changed here apply to endpoints added from now on."""
        if (rate_limit is not None or burst is not None) and clear_rate_limit:
            raise InvalidMessage("rate_limit", "give a rate limit or remove it, not both")
        if retry_schedule is not None and clear_retry_schedule:
            raise InvalidMessage("retry_schedule", "give a retry schedule or remove it, not both")
        rate = rate_fields(rate_limit, burst)
        params = {
            "external_id": check_tenant_id(external_id, "external_id"),
            "set_name": name is not None,
            "name": None if name is None else _check_name(name),
            "set_metadata": metadata is not None,
            "metadata": None if metadata is None else json.dumps(check_metadata(metadata)),
            "set_rate": rate_limit is not None or clear_rate_limit,
            **rate,
            "set_retry_schedule": retry_schedule is not None or clear_retry_schedule,
            "retry_schedule": check_retry_schedule(retry_schedule),
        }
        return self._run(tx, self._update_plan(params))

    def _update_plan(self, params: dict[str, Any]) -> Plan[Tenant]:
        ids: list[int] = yield self.queries["tenant_update"], params, scalar
        if not ids:
            raise InvalidArgument("external_id", f"no tenant with id {params['external_id']!r}")
        return (yield from self._require_plan(params["external_id"]))

    def delete(self, tx: Any, external_id: str) -> TenantDeleted:
        """Delete the tenant and its endpoints (each as
        :meth:`Endpoints.delete` deletes one: its waiting messages become dead,
        its delivered history is kept)."""
        return self._run(tx, self._delete_plan(check_tenant_id(external_id, "external_id")))

    def _delete_plan(self, external_id: str) -> Plan[TenantDeleted]:
        ids: list[int] = yield (
            self.queries["tenant_lock"],
            {"external_id": external_id},
            scalar,
        )
        if not ids:
            raise InvalidArgument("external_id", f"no tenant with id {external_id!r}")
        endpoint_ids: list[int] = yield self.queries["tenant_endpoint_ids"], {"id": ids[0]}, scalar
        endpoints = Endpoints(schema=self.queries.schema)
        messages = 0
        for endpoint_id in endpoint_ids:
            messages += yield from endpoints._delete_plan(endpoint_id)
        yield self.queries["tenant_delete"], {"id": ids[0]}, None
        return TenantDeleted(len(endpoint_ids), messages)
