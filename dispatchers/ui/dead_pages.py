"""The dashboard's dead letters: the list (read as the API reads it, newest
first by id), and retry or purge by selection.

A selection is the ticked messages, or the list's filters; an action asks for
confirmation first (a page that names how many messages it touches), then writes
in one transaction through the library's dead-letter functions
(:func:`~outbox.admin.dead_retry`, :func:`~outbox.admin.dead_purge`), logs what it
did to how many, and redirects to the list with a banner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from dispatchers.store.web import endpoints as web_endpoints
from dispatchers.store.web import messages as web_messages
from dispatchers.ui.dashboard import (
    bad,
    dashboard_of,
    log_action,
    read_form,
    render,
)
from dispatchers.ui.fields import (
    SPANS,
    BadInput,
    read_id,
    read_ids,
    read_since,
    read_tenant,
    read_text,
)
from outbox.admin import dead_count, dead_purge, dead_retry
from outbox.internal import MAX_ID

DEAD_LIMIT = 100
"""The most dead messages one page lists."""


def _notice(fields: Mapping[str, Any]) -> str | None:
    """What the dead-letter page says after an action redirected to it."""
    done, count = fields.get("done"), fields.get("count", "")
    if done not in ("retry", "purge") or not count.isascii() or not count.isdigit():
        return None
    verb = "Retried" if done == "retry" else "Purged"
    return f"{verb} {int(count)} dead message(s)."


def _dead_filters(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "endpoint_id": read_id(fields, "endpoint"),
        "event_type": read_text(fields, "event_type"),
        "since": read_since(fields),
        "tenant": read_tenant(fields),
    }


def _selection(filters: Mapping[str, Any]) -> dict[str, Any]:
    """The dead-letter functions' selection: the filters given, or every dead
    message when none is (the confirmation page says which)."""
    given = {k: v for k, v in filters.items() if v is not None}
    return given or {"all_": True}


def _filter_query(filters: Mapping[str, Any]) -> dict[str, str]:
    """Filters as query or form fields that parse back to the same filters."""
    fields = {
        "endpoint": filters["endpoint_id"],
        "event_type": filters["event_type"],
        "since": filters["since"].isoformat() if filters["since"] else None,
        "tenant": filters["tenant"],
    }
    return {k: str(v) for k, v in fields.items() if v is not None}


async def dead(request: web.Request) -> web.StreamResponse:
    store = dashboard_of(request).store
    try:
        filters = _dead_filters(request.query)
    except BadInput as exc:
        return bad(request, exc)

    def read(conn: Any) -> tuple[list[web_messages.Dead], dict[int, str], str | None]:
        scope = store.tenant_filter(conn, filters["tenant"])
        rows = (
            []
            if scope is None
            else web_messages.dead_page(
                conn,
                store.schema,
                tenant_id=scope[0],
                untenanted=scope[1],
                endpoint_id=filters["endpoint_id"],
                event_type=filters["event_type"],
                since=filters["since"],
                before=MAX_ID,
                limit=DEAD_LIMIT,
            )
        )
        ids = [m.endpoint_id for m in rows if m.endpoint_id is not None]
        unknown = store.unknown_tenant(conn, filters["tenant"]) if not rows else None
        return rows, web_endpoints.tenants_of(conn, store.schema, ids), unknown

    rows, tenants, unknown_tenant = await store.read(read)
    return render(
        request,
        "dead.html",
        rows=rows,
        tenants=tenants,
        unknown_tenant=unknown_tenant,
        limit=DEAD_LIMIT,
        spans=SPANS,
        query={
            "endpoint": filters["endpoint_id"],
            "event_type": filters["event_type"],
            "since": read_text(request.query, "since"),
            "tenant": filters["tenant"],
        },
        filter_query=urlencode(_filter_query(filters)),
        notice=_notice(request.query),
    )


async def dead_confirm(request: web.Request) -> web.StreamResponse:
    """How many dead messages an action would touch: those selected (``id``, one
    per checkbox), else those matching the filters; its button posts them."""
    store = dashboard_of(request).store
    action = request.query.get("action")
    try:
        if action not in ("retry", "purge"):
            raise BadInput("action: must be retry or purge")
        ids = read_ids(request.query, "id", most=DEAD_LIMIT)
        if request.query.get("selected") and not ids:
            raise BadInput("id: no message selected; tick the ones to act on")
        filters = _dead_filters(request.query)
    except BadInput as exc:
        return bad(request, exc)
    selection = {"ids": ids} if ids else _selection(filters)
    count = await store.read(lambda conn: dead_count(conn, schema=store.schema, **selection))
    return render(
        request,
        "confirm.html",
        action=action,
        count=count,
        filters=filters,
        ids=ids,
        fields={} if ids else _filter_query(filters),
    )


async def dead_act(request: web.Request) -> web.StreamResponse:
    dashboard = dashboard_of(request)
    store = dashboard.store
    action = request.match_info["action"]
    form = await read_form(request)
    try:
        ids = read_ids(form, "id", most=DEAD_LIMIT)
        filters = _dead_filters(form)
    except BadInput as exc:
        return bad(request, exc)
    selection = {"ids": ids} if ids else _selection(filters)
    act = dead_retry if action == "retry" else dead_purge
    count = await store.write(lambda conn: act(conn, schema=store.schema, **selection))
    if ids:
        log_action(dashboard, f"dead_{action}", count, ids=ids)
        query = {"done": action, "count": str(count)}
    else:
        log_action(dashboard, f"dead_{action}", count, **_filter_query(filters))
        query = {**_filter_query(filters), "done": action, "count": str(count)}
    raise web.HTTPSeeOther("/dead?" + urlencode(query))
