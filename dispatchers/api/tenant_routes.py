"""Routes of tenants, by external id: list, create, show, update, delete. The
operator's alone: a tenant's token manages no tenant, its own included.

Every change goes through :class:`outbox.Tenants`, in one transaction with its
audit entry. Deleting a tenant deletes its endpoints (their waiting messages
die) and its API tokens.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dispatchers.api import cursors
from dispatchers.api.calls import Call, Route, changes_of, library_errors, not_found
from dispatchers.api.problems import invalid
from dispatchers.api.requests import (
    PageQuery,
    PortalLinkCreate,
    TenantCreate,
    TenantPath,
    TenantUpdate,
)
from dispatchers.api.responses import (
    PortalLinkOut,
    PortalLinksRevoked,
    TenantDeleted,
    TenantOut,
    TenantPage,
)
from dispatchers.api.store import Conn, audit
from outbox.portal import create_link, revoke_tenant
from outbox.tenants import Tenant, Tenants

TAG = "tenants"


def _shown(tenant: Tenant) -> TenantOut:
    data = tenant.as_dict()
    data["external_id"] = data.pop("id")
    return TenantOut(**data)


def _dump(tenant: TenantOut | None) -> dict[str, Any] | None:
    return None if tenant is None else tenant.model_dump(mode="json")


def _found(conn: Conn, call: Call, external_id: str) -> TenantOut:
    tenant = Tenants(schema=call.schema).get(conn, external_id)
    if tenant is None:
        raise not_found("tenant", repr(external_id))
    return _shown(tenant)


async def list_tenants(call: Call) -> TenantPage:
    query = call.query(PageQuery)
    after = None
    if query.cursor is not None:
        try:
            after = cursors.decode_text("tenants", query.cursor, key=await call.cursor_key())
        except cursors.BadCursor as exc:
            raise invalid("query.cursor", str(exc)) from None

    def work(conn: Conn) -> list[Tenant]:
        with library_errors("query", after="query.cursor"):
            return Tenants(schema=call.schema).all(conn, after=after, limit=query.limit + 1)

    found = await call.read(work)
    page = found[: query.limit]
    more = len(found) > query.limit
    return TenantPage(
        items=[_shown(t) for t in page],
        next_cursor=(
            cursors.encode("tenants", page[-1].external_id, key=await call.cursor_key())
            if more
            else None
        ),
    )


async def create_tenant(call: Call) -> TenantOut:
    body = call.body(TenantCreate)

    def work(conn: Conn) -> TenantOut:
        with library_errors():
            added = _shown(
                Tenants(schema=call.schema).add(
                    conn, **body.model_dump(exclude={"external_id"}), external_id=body.external_id
                )
            )
        audit(
            conn, call.schema, call.who, "create", "tenant", added.external_id, after=_dump(added)
        )
        return added

    return await call.write(work)


async def show_tenant(call: Call) -> TenantOut:
    external_id = call.path(TenantPath).external_id
    return await call.read(lambda conn: _found(conn, call, external_id))


async def update_tenant(call: Call) -> TenantOut:
    external_id = call.path(TenantPath).external_id
    body = call.body(TenantUpdate)
    changes = changes_of(body)

    def work(conn: Conn) -> TenantOut:
        before = _found(conn, call, external_id)
        with library_errors():
            after = _shown(Tenants(schema=call.schema).update(conn, external_id, **changes))
        audit(
            conn,
            call.schema,
            call.who,
            "update",
            "tenant",
            external_id,
            before=_dump(before),
            after=_dump(after),
            detail={"fields": sorted(body.model_fields_set)},
        )
        return after

    return await call.write(work)


async def delete_tenant(call: Call) -> TenantDeleted:
    external_id = call.path(TenantPath).external_id

    def work(conn: Conn) -> TenantDeleted:
        before = _found(conn, call, external_id)
        deleted = Tenants(schema=call.schema).delete(conn, external_id)
        audit(
            conn,
            call.schema,
            call.who,
            "delete",
            "tenant",
            external_id,
            before=_dump(before),
            detail=deleted._asdict(),
        )
        return TenantDeleted(
            external_id=external_id, endpoints=deleted.endpoints, messages=deleted.messages
        )

    return await call.write(work)


async def create_portal_link(call: Call) -> PortalLinkOut:
    external_id = call.path(TenantPath).external_id
    body = call.body(PortalLinkCreate)

    def work(conn: Conn) -> PortalLinkOut:
        _found(conn, call, external_id)
        link = create_link(
            conn,
            tenant=external_id,
            expires=timedelta(seconds=body.expires_in_s),
            schema=call.schema,
        )
        # the link's id and expiry; never its token
        audit(
            conn,
            call.schema,
            call.who,
            "create",
            "portal_link",
            link.id,
            detail={"tenant": external_id, "expires_at": link.expires_at.isoformat()},
        )
        return PortalLinkOut(
            id=link.id,
            tenant=external_id,
            url_path=link.url_path,
            token=link.token,
            expires_at=link.expires_at,
        )

    return await call.write(work)


async def revoke_portal_links(call: Call) -> PortalLinksRevoked:
    external_id = call.path(TenantPath).external_id

    def work(conn: Conn) -> PortalLinksRevoked:
        _found(conn, call, external_id)
        revoked = revoke_tenant(conn, external_id, schema=call.schema)
        audit(
            conn,
            call.schema,
            call.who,
            "revoke",
            "portal_link",
            external_id,
            detail={"tenant": external_id, "revoked": revoked},
        )
        return PortalLinksRevoked(tenant=external_id, revoked=revoked)

    return await call.write(work)


ROUTES = [
    Route("GET", "/tenants", list_tenants, TenantPage, "List tenants by external id", TAG,
          query_model=PageQuery, operator_only=True),
    Route("POST", "/tenants", create_tenant, TenantOut, "Create a tenant", TAG, status=201,
          body_model=TenantCreate, operator_only=True),
    Route("GET", "/tenants/{external_id}", show_tenant, TenantOut, "Show a tenant", TAG,
          path_model=TenantPath, operator_only=True),
    Route("PATCH", "/tenants/{external_id}", update_tenant, TenantOut,
          "Change a tenant (its defaults apply to endpoints added from now on; null clears)",
          TAG, path_model=TenantPath, body_model=TenantUpdate, operator_only=True),
    Route("DELETE", "/tenants/{external_id}", delete_tenant, TenantDeleted,
          "Delete a tenant with its endpoints and API tokens", TAG, path_model=TenantPath,
          operator_only=True),
    Route("POST", "/tenants/{external_id}/portal-links", create_portal_link, PortalLinkOut,
          "Make a link to the tenant's consumer portal (its token is shown once)", TAG,
          status=201, path_model=TenantPath, body_model=PortalLinkCreate, operator_only=True),
    Route("DELETE", "/tenants/{external_id}/portal-links", revoke_portal_links,
          PortalLinksRevoked, "End every working link to the tenant's consumer portal", TAG,
          path_model=TenantPath, operator_only=True),
]  # fmt: skip
