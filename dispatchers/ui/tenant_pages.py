"""The tenant pages of the dashboard: the tenants, a page at a time, and one
tenant with its defaults and its endpoints.

A tenant is named in the address by its external id (``/tenants/customer-17``);
an id that cannot be a tenant's, or that names none, is a 404 page saying so.
The pages only read: tenants are created and changed with ``outbox tenants``
(or :class:`outbox.Tenants`), and an endpoint is added to a tenant through the
endpoint form (:mod:`dispatchers.ui.endpoint_forms`, ``/endpoints/new?tenant=``).
The other lists take a ``tenant`` filter, which the tenant's page links to.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from dispatchers.store.web import endpoints as web_endpoints
from dispatchers.store.web.endpoints import Listed
from dispatchers.ui.dashboard import bad, dashboard_of, render
from dispatchers.ui.fields import BadInput, read_tenant
from dispatchers.ui.limits import ENDPOINTS_PAGE, TENANTS_PAGE
from dispatchers.ui.policy_text import format_schedule, rate_text
from outbox.tenants import Tenant, Tenants

SHOWN_METADATA = 300
"""The most characters of a tenant's metadata (as JSON) its page shows."""


async def tenants(request: web.Request) -> web.StreamResponse:
    """One page of the tenants, by external id; ``after``: the last id of the
    page before (keyset: as cheap on the last page as on the first)."""
    store = dashboard_of(request).store
    try:
        after = read_tenant(request.query, "after", or_none=False)
    except BadInput as exc:
        return bad(request, exc)
    rows = await store.read(
        lambda conn: Tenants(schema=store.schema).all(conn, after=after, limit=TENANTS_PAGE + 1)
    )
    more, rows = len(rows) > TENANTS_PAGE, rows[:TENANTS_PAGE]
    return render(
        request,
        "tenants.html",
        rows=rows,
        first=after is not None,
        following=urlencode({"after": rows[-1].external_id}) if more else None,
        page_size=TENANTS_PAGE,
    )


def not_found(request: web.Request, given: str) -> web.Response:
    """The 404 page of a tenant's address that names no tenant."""
    return render(
        request,
        "error.html",
        status=404,
        message=f"No tenant has id {given[:130]!r}.",
    )


async def tenant(request: web.Request) -> web.StreamResponse:
    """One tenant: its name and metadata, the defaults its new endpoints take,
    its first endpoints, and links to its messages and dead letters."""
    store = dashboard_of(request).store
    given = request.match_info["tenant"]
    try:
        external_id = read_tenant({"tenant": given}, or_none=False)
    except BadInput:
        return render(
            request,
            "error.html",
            status=404,
            message=(
                f"No tenant has id {given[:130]!r}: a tenant's id is 1-128 letters, digits "
                "and ._:@-, starting with a letter or a digit."
            ),
        )
    if external_id is None:  # blank: the route gives no such id
        return not_found(request, given)

    def read(conn: Any) -> tuple[Tenant | None, list[Listed]]:
        found = store.tenant(conn, external_id)
        tenant_id = web_endpoints.tenant_id(conn, store.schema, external_id)
        if found is None or tenant_id is None:
            return None, []
        page = web_endpoints.page(conn, store.schema, tenant_id=tenant_id, limit=ENDPOINTS_PAGE)
        return found, web_endpoints.listed(conn, store.schema, page, tenant_id=tenant_id)

    found, endpoints = await store.read(read)
    if found is None:
        return not_found(request, external_id)
    metadata = json.dumps(found.metadata, ensure_ascii=False, sort_keys=True)
    return render(
        request,
        "tenant.html",
        tenant=found,
        metadata=None if not found.metadata else metadata,
        metadata_cut=len(metadata) > SHOWN_METADATA,
        shown_metadata=SHOWN_METADATA,
        rate=rate_text(found.rate_limit_per_s, found.burst),
        schedule=format_schedule(found.retry_schedule),
        endpoints=endpoints,
        query=urlencode({"tenant": found.external_id}),
    )
