"""The dashboard's endpoint forms: add, edit and delete an endpoint.

Each form is read back from the posted fields and written through the library's
:class:`~outbox.endpoints.Endpoints`, which checks every field; a refusal shows the
form again with the posted values and the field named, and writes nothing. The
endpoint's pages (list, detail, secrets, replay) are in
:mod:`dispatchers.ui.endpoint_pages`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from dispatchers.store.web import endpoints as web_endpoints
from dispatchers.store.web.endpoints import Listed
from dispatchers.ui.dashboard import bad, dashboard_of, log_action, read_form, render
from dispatchers.ui.fields import (
    BadInput,
    read_cap,
    read_choice,
    read_count,
    read_rate,
    read_schedule,
    read_tenant,
    read_text,
    route_id,
)
from dispatchers.ui.policy_text import format_schedule, rate_text
from outbox.endpoints import Endpoint
from outbox.errors import InvalidArgument
from outbox.secrets import fingerprint, generate_secret

FORM_FIELDS = (
    "url",
    "description",
    "event_types",
    "filter",
    "cap",
    "rate_limit",
    "burst",
    "retry_schedule",
)
"""The fields of the endpoint form, in the order it shows them."""


def form_values(endpoint: Endpoint | None) -> dict[str, str]:
    """The endpoint form's fields as they show ``endpoint`` (blank for a new one)."""
    if endpoint is None:
        return dict.fromkeys(FORM_FIELDS, "")
    rate = endpoint.rate_limit_per_s
    return {
        "url": endpoint.url,
        "description": endpoint.description,
        "event_types": "\n".join(endpoint.event_types),
        "filter": endpoint.filter or "",
        "cap": "" if endpoint.max_concurrency is None else str(endpoint.max_concurrency),
        "rate_limit": "" if rate is None else repr(rate),
        "burst": "" if rate is None or endpoint.burst is None else str(endpoint.burst),
        "retry_schedule": format_schedule(endpoint.retry_schedule) or "",
    }


def _posted(form: Mapping[str, Any]) -> dict[str, str]:
    """The form's fields as posted, to show them again beside what is wrong."""
    return {name: str(form.get(name, ""))[:2000] for name in FORM_FIELDS}


def _changes(form: Mapping[str, Any], *, adding: bool) -> dict[str, Any]:
    """The arguments of :meth:`Endpoints.update` (or ``add``) for the fields the
    form holds: a blank field clears its setting, a field not posted keeps it.
    What each may hold beyond its form (a URL, a filter, a schedule's bounds),
    :class:`~outbox.endpoints.Endpoints` checks, naming the field."""
    changes: dict[str, Any] = {}
    if adding or "url" in form:
        url = read_text(form, "url")
        if url is None:
            raise BadInput("url: required")
        changes["url"] = url
    if "description" in form:
        changes["description"] = read_text(form, "description") or ""
    if "event_types" in form:
        changes["event_types"] = (read_text(form, "event_types") or "").replace(",", " ").split()
    if "filter" in form:
        changes["filter"] = read_text(form, "filter")
        changes["clear_filter"] = changes["filter"] is None
    if "cap" in form:
        changes["max_concurrency"] = read_cap(form)
        changes["clear_max_concurrency"] = changes["max_concurrency"] is None
    if "rate_limit" in form or "burst" in form:
        rate, burst = read_rate(form), read_count(form, "burst")
        if rate is None and burst is not None:
            raise BadInput("burst: needs a rate limit")
        changes.update(rate_limit=rate, burst=burst, clear_rate_limit=rate is None)
    if "retry_schedule" in form:
        changes["retry_schedule"] = read_schedule(form)
        changes["clear_retry_schedule"] = changes["retry_schedule"] is None
    if adding:  # a new endpoint has nothing to clear
        changes = {k: v for k, v in changes.items() if not k.startswith("clear_")}
    return changes


def _form_refused(
    request: web.Request,
    problem: ValueError,
    values: dict[str, str],
    *,
    endpoint_id: int | None,
    tenant: str | None = None,
) -> web.Response:
    """The endpoint form again, with what was posted and what is wrong; nothing
    was written."""
    field = problem.field if isinstance(problem, InvalidArgument) else str(problem).split(":")[0]
    return render(
        request,
        "endpoint_form.html",
        status=400,
        endpoint_id=endpoint_id,
        tenant=tenant,
        defaults=None,
        values=values,
        error=str(problem),
        error_field=field,
    )


async def endpoint_edit(request: web.Request) -> web.StreamResponse:
    """Change an endpoint's settings: those the form holds (URL, description,
    event types, one per line or comma-separated, none for every type; filter,
    cap, rate limit and burst, retry schedule), a blank one cleared. A value the
    library refuses shows the form again, naming the field; nothing is written."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    form = await read_form(request)
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)
    try:
        changes = _changes(form, adding=False)
    except BadInput as exc:
        return _form_refused(request, exc, _posted(form), endpoint_id=endpoint_id)
    box = dashboard.endpoints()
    try:
        await store.write(lambda conn: box.update(conn, endpoint_id, **changes))
    except InvalidArgument as exc:
        return _form_refused(request, exc, _posted(form), endpoint_id=endpoint_id)
    changed = sorted(k for k in changes if not k.startswith("clear_"))
    log_action(dashboard, "endpoint_edit", 1, endpoint_id=endpoint_id, fields=changed)
    raise web.HTTPSeeOther(f"/endpoints/{endpoint_id}?done=edit")


async def endpoint_new(request: web.Request) -> web.StreamResponse:
    """The form that adds an endpoint; with ``tenant``, one of that tenant's,
    whose blank rate limit and retry schedule take the tenant's."""
    store = dashboard_of(request).store
    try:
        tenant = read_tenant(request.query, or_none=False)
    except BadInput as exc:
        return bad(request, exc)
    defaults = None
    if tenant is not None:
        found = await store.read(lambda conn: store.tenant(conn, tenant))
        if found is None:
            return render(
                request, "error.html", status=404, message=f"No tenant has id {tenant!r}."
            )
        defaults = {
            "rate": rate_text(found.rate_limit_per_s, found.burst),
            "schedule": format_schedule(found.retry_schedule),
        }
    return render(
        request,
        "endpoint_form.html",
        endpoint_id=None,
        tenant=tenant,
        defaults=defaults,
        values=form_values(None),
        error=None,
        error_field=None,
    )


PLAIN_REFUSED = (
    "Signing secrets here are sealed, and this dashboard was not given the key: "
    "a new secret would be stored in plain text. Start outbox ui with "
    "--secrets-key-file (or OUTBOX_SECRETS_KEY) to {what}."
)


async def endpoint_add(request: web.Request) -> web.StreamResponse:
    """Add an endpoint with a new signing secret, shown once on the page that
    answers (as a rotation's is); with ``tenant``, to that tenant
    (:meth:`Endpoints.add` refuses one that does not exist, naming the field).
    Refused, as a rotation is, where secrets are sealed and the dashboard has no
    key."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    form = await read_form(request)
    try:
        tenant = read_tenant(form, or_none=False)
    except BadInput as exc:
        return bad(request, exc)
    try:
        changes = _changes(form, adding=True)
    except BadInput as exc:
        return _form_refused(request, exc, _posted(form), endpoint_id=None, tenant=tenant)
    box = dashboard.endpoints()
    secret = generate_secret()

    def add(conn: Any) -> Endpoint | None:
        if dashboard.keyring is None and web_endpoints.secrets_sealed(conn, store.schema):
            return None
        return box.add(conn, secret=secret, tenant=tenant, **changes)

    try:
        added = await store.write(add)
    except InvalidArgument as exc:
        return _form_refused(request, exc, _posted(form), endpoint_id=None, tenant=tenant)
    if added is None:
        message = PLAIN_REFUSED.format(what="add an endpoint")
        return render(request, "error.html", status=409, message=message)
    log_action(
        dashboard,
        "endpoint_add",
        1,
        endpoint_id=added.id,
        new=fingerprint(secret),
        **({} if tenant is None else {"tenant": tenant}),
    )
    return render(
        request, "rotated.html", endpoint=added, secret=secret, overlap_hours=0, added=True
    )


DELETE = "delete"
"""The value of the ``confirm`` field that the delete confirmation posts."""


async def endpoint_delete_confirm(request: web.Request) -> web.StreamResponse:
    """What deleting the endpoint does (its waiting messages become dead), and
    the button that does it."""
    store = dashboard_of(request).store
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)

    def read(conn: Any) -> Listed | None:
        found = web_endpoints.get(conn, store.schema, endpoint_id, tenant_id=None)
        if found is None:
            return None
        return web_endpoints.listed(conn, store.schema, [found], tenant_id=None)[0]

    listed = await store.read(read)
    if listed is None:
        return render(request, "error.html", status=404, message=f"No endpoint {endpoint_id}.")
    return render(request, "endpoint_delete.html", endpoint=listed, confirm=DELETE)


async def endpoint_delete(request: web.Request) -> web.StreamResponse:
    """Delete an endpoint once confirmed (:meth:`Endpoints.delete`: its waiting
    messages become dead, its delivered history stays); a form without
    ``confirm`` is sent to the confirmation page, nothing changed."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        endpoint_id = route_id(request)
        confirmed = read_choice(await read_form(request), "confirm", (DELETE,))
    except BadInput as exc:
        return bad(request, exc)
    if confirmed is None:
        raise web.HTTPSeeOther(f"/endpoints/{endpoint_id}/delete")
    box = dashboard.endpoints()
    try:
        count = await store.write(lambda conn: box.delete(conn, endpoint_id))
    except InvalidArgument as exc:
        return bad(request, exc)
    log_action(dashboard, "endpoint_delete", count, endpoint_id=endpoint_id)
    raise web.HTTPSeeOther(
        f"/endpoints?{urlencode({'done': 'delete', 'id': endpoint_id, 'count': count})}"
    )
