"""The portal's endpoint pages: one endpoint, and the changes a tenant's user
makes to the tenant's endpoints (add one, edit its URL, description and event
types, enable or disable it, reveal or rotate its signing secret, send it a
test event, delete it).

An endpoint is read as a tenant's API token reads it
(:mod:`dispatchers.store.web.endpoints`, scoped to the tenant): one of another
tenant is "no such endpoint", as a missing one is. Every change goes through
:class:`outbox.endpoints.Endpoints`, which checks each field and names the one
it refuses, once the endpoint is found to be the tenant's; a new one is the
tenant's, with its rate limit and retry schedule. The operator's policies
(caps, rate limits, schedules, filters, TLS, credentials) are not offered here.
A signing secret is shown only on the page that answers a POST, logged by its
fingerprint only; where secrets are sealed and no key is held, none is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from aiohttp import web

from dispatchers.portal.pages import LISTED, error, link_of, log_action, portal_of, render
from dispatchers.store.web import endpoints as web_endpoints
from dispatchers.store.web import messages as web_messages
from dispatchers.store.web.endpoints import Listed, shown_secrets
from dispatchers.store.web.messages import MessageSummary
from dispatchers.ui.dashboard import read_form
from dispatchers.ui.fields import BadInput, read_choice, read_text, route_id
from outbox.admin import send_test_event
from outbox.endpoints import DEFAULT_ROTATION_OVERLAP, Endpoint
from outbox.errors import InvalidArgument
from outbox.portal import PATH_PREFIX
from outbox.secrets import fingerprint, generate_secret

FIELDS = ("url", "description", "event_types")
"""The fields of the portal's endpoint form, in the order it shows them."""

NO_ENDPOINT = "There is no such endpoint here."

PLAIN_REFUSED = (
    "Signing secrets here are sealed, and this server was not given the key: a new "
    "secret would be stored in plain text, so none is made. Ask the operator of this "
    "service to configure the key."
)

ROTATE, DELETE = "rotate", "delete"
"""The values of the ``confirm`` field that the confirmation pages post."""

DISABLED_HERE = "disabled from the portal"


def _listed(conn: Any, schema: str, tenant_id: int, endpoint_id: int) -> Listed | None:
    """The tenant's endpoint with its backlog, or None (missing, or another's)."""
    found = web_endpoints.get(conn, schema, endpoint_id, tenant_id=tenant_id)
    if found is None:
        return None
    return web_endpoints.listed(conn, schema, [found], tenant_id=tenant_id)[0]


def _base(request: web.Request) -> str:
    return f"{PATH_PREFIX}{request.match_info['token']}/"


def _values(endpoint: Endpoint | Listed | None) -> dict[str, str]:
    if endpoint is None:
        return dict.fromkeys(FIELDS, "")
    return {
        "url": endpoint.url,
        "description": endpoint.description,
        "event_types": "\n".join(endpoint.event_types),
    }


def _posted(form: Mapping[str, Any]) -> dict[str, str]:
    return {name: str(form.get(name, ""))[:2000] for name in FIELDS}


def _changes(form: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of ``Endpoints.add`` and ``update`` the form gives: its URL
    (required), description, and event types (one per line or comma-separated;
    none for every type)."""
    url = read_text(form, "url")
    if url is None:
        raise BadInput("url: required")
    types = (read_text(form, "event_types") or "").replace(",", " ").split()
    return {"url": url, "description": read_text(form, "description") or "", "event_types": types}


def _refused(
    request: web.Request, problem: ValueError, form: Mapping[str, Any], endpoint_id: int | None
) -> web.Response:
    """The form again with what was posted and what is wrong; nothing written."""
    field = problem.field if isinstance(problem, InvalidArgument) else str(problem).split(":")[0]
    return render(
        request,
        "endpoint_form.html",
        status=400,
        endpoint_id=endpoint_id,
        values=_posted(form),
        error=str(problem),
        error_field=field,
    )


async def endpoint_new(request: web.Request) -> web.StreamResponse:
    values = _values(None)
    return render(
        request, "endpoint_form.html", endpoint_id=None, values=values, error=None, error_field=None
    )


async def endpoint_add(request: web.Request) -> web.StreamResponse:
    """Add an endpoint of the tenant with a new signing secret, shown once."""
    portal, link = portal_of(request), link_of(request)
    dashboard = portal.dashboard
    form = await read_form(request)
    try:
        changes = _changes(form)
    except BadInput as exc:
        return _refused(request, exc, form, None)
    box, secret = dashboard.endpoints(), generate_secret()

    def add(conn: Any) -> Endpoint | None:
        if dashboard.keyring is None and web_endpoints.secrets_sealed(conn, dashboard.store.schema):
            return None
        return box.add(conn, secret=secret, tenant=link.tenant, **changes)

    try:
        added = await dashboard.store.write(add)
    except InvalidArgument as exc:
        return _refused(request, exc, form, None)
    if added is None:
        return error(request, 409, PLAIN_REFUSED)
    log_action(request, "endpoint_add", 1, endpoint_id=added.id, new=fingerprint(secret))
    return render(request, "secret.html", endpoint=added, secrets=[secret], done="added")


async def endpoint(request: web.Request) -> web.StreamResponse:
    """One endpoint of the tenant: its settings, state, secrets as fingerprints,
    the form that changes it, its actions and its latest deliveries."""
    portal, link = portal_of(request), link_of(request)
    dashboard = portal.dashboard
    schema = dashboard.store.schema
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return error(request, 400, str(exc))

    def read(conn: Any) -> tuple[Listed | None, list[MessageSummary]]:
        found = _listed(conn, schema, link.tenant_id, endpoint_id)
        if found is None:
            return None, []
        latest = web_messages.deliveries(
            conn, schema, tenant_id=link.tenant_id, endpoint_id=endpoint_id, limit=LISTED
        )
        return found, latest

    found, latest = await dashboard.store.read(read)
    if found is None:
        return error(request, 404, NO_ENDPOINT)
    return render(
        request,
        "endpoint.html",
        endpoint=found,
        secrets=shown_secrets(found.secrets, found.id, dashboard.keyring),
        deliveries=latest,
        values=_values(found),
        error=None,
        error_field=None,
        notice="Saved." if request.query.get("done") == "edit" else None,
    )


async def _owned(request: web.Request, work: Any, *, read: bool = False) -> Any:
    """``work(conn, endpoint_id)`` in one transaction once the endpoint is found
    to be the tenant's; None otherwise (missing, or another's). What the library
    then refuses (the endpoint deleted meanwhile) is the guard's 409 page."""
    link, dashboard = link_of(request), portal_of(request).dashboard
    endpoint_id = route_id(request)

    def run(conn: Any) -> Any:
        schema = dashboard.store.schema
        if web_endpoints.get(conn, schema, endpoint_id, tenant_id=link.tenant_id) is None:
            return None
        return work(conn, endpoint_id)

    return await (dashboard.store.read if read else dashboard.store.write)(run)


async def endpoint_edit(request: web.Request) -> web.StreamResponse:
    """Change the endpoint's URL, description and event types."""
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return error(request, 400, str(exc))
    form = await read_form(request)
    box = portal_of(request).dashboard.endpoints()
    try:
        changes = _changes(form)
    except BadInput as exc:
        # the form again, but only for an endpoint of the tenant's
        owned = await _owned(request, lambda conn, i: True, read=True)
        return (
            error(request, 404, NO_ENDPOINT)
            if owned is None
            else _refused(request, exc, form, endpoint_id)
        )
    try:
        edited = await _owned(request, lambda conn, i: box.update(conn, i, **changes))
    except InvalidArgument as exc:
        return _refused(request, exc, form, endpoint_id)
    if edited is None:
        return error(request, 404, NO_ENDPOINT)
    log_action(request, "endpoint_edit", 1, endpoint_id=endpoint_id, fields=sorted(changes))
    raise web.HTTPSeeOther(f"{_base(request)}endpoints/{endpoint_id}?done=edit")


async def endpoint_toggle(request: web.Request) -> web.StreamResponse:
    """Enable the endpoint (its paused messages resume) or disable it (its
    waiting messages pause until it is enabled)."""
    action = request.match_info["action"]
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return error(request, 400, str(exc))
    box = portal_of(request).dashboard.endpoints()

    def toggle(conn: Any, i: int) -> int:
        if action == "enable":
            return box.enable(conn, i)
        return box.disable(conn, i, reason=DISABLED_HERE)

    moved = await _owned(request, toggle)
    if moved is None:
        return error(request, 404, NO_ENDPOINT)
    log_action(request, f"endpoint_{action}", moved, endpoint_id=endpoint_id)
    raise web.HTTPSeeOther(f"{_base(request)}endpoints/{endpoint_id}")


async def secret_reveal(request: web.Request) -> web.StreamResponse:
    """The endpoint's signing secrets in force, on this page only."""
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return error(request, 400, str(exc))
    box = portal_of(request).dashboard.endpoints()
    found = await _owned(request, lambda conn, i: box.get(conn, i), read=True)
    if found is None:
        return error(request, 404, NO_ENDPOINT)
    log_action(request, "endpoint_reveal_secret", 1, endpoint_id=endpoint_id)
    shown = [s.secret for s in found.secrets]
    return render(request, "secret.html", endpoint=found, secrets=shown, done="revealed")


async def rotate_confirm(request: web.Request) -> web.StreamResponse:
    return await _confirm(request, "rotate.html", ROTATE)


async def delete_confirm(request: web.Request) -> web.StreamResponse:
    return await _confirm(request, "delete.html", DELETE)


async def _confirm(request: web.Request, template: str, confirm: str) -> web.StreamResponse:
    """What an action does, and the button that does it."""
    link, dashboard = link_of(request), portal_of(request).dashboard
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return error(request, 400, str(exc))
    schema = dashboard.store.schema
    found = await dashboard.store.read(
        lambda conn: _listed(conn, schema, link.tenant_id, endpoint_id)
    )
    if found is None:
        return error(request, 404, NO_ENDPOINT)
    hours = DEFAULT_ROTATION_OVERLAP / timedelta(hours=1)
    return render(request, template, endpoint=found, confirm=confirm, overlap_hours=hours)


async def rotate(request: web.Request) -> web.StreamResponse:
    """Sign with a new secret once confirmed; the previous ones keep signing for
    a day. The new one is shown on the page that answers, only there."""
    dashboard = portal_of(request).dashboard
    try:
        endpoint_id = route_id(request)
        confirmed = read_choice(await read_form(request), "confirm", (ROTATE,))
    except BadInput as exc:
        return error(request, 400, str(exc))
    if confirmed is None:
        raise web.HTTPSeeOther(f"{_base(request)}endpoints/{endpoint_id}/rotate-secret")
    box, secret = dashboard.endpoints(), generate_secret()

    def act(conn: Any, i: int) -> Endpoint | bool:
        if dashboard.keyring is None and web_endpoints.secrets_sealed(conn, dashboard.store.schema):
            return False
        return box.rotate_secret(conn, i, secret=secret)

    rotated = await _owned(request, act)
    if rotated is None:
        return error(request, 404, NO_ENDPOINT)
    if rotated is False:
        return error(request, 409, PLAIN_REFUSED)
    log_action(
        request, "endpoint_rotate_secret", 1, endpoint_id=endpoint_id, new=fingerprint(secret)
    )
    hours = DEFAULT_ROTATION_OVERLAP / timedelta(hours=1)
    return render(
        request,
        "secret.html",
        endpoint=rotated,
        secrets=[secret],
        done="rotated",
        overlap_hours=hours,
    )


async def test_event(request: web.Request) -> web.StreamResponse:
    """Send the endpoint a test event and show its message, where its attempt
    and the receiver's reply appear once a dispatcher made it."""
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return error(request, 400, str(exc))
    schema = portal_of(request).dashboard.store.schema
    try:
        sent = await _owned(
            request, lambda conn, i: send_test_event(conn, schema=schema, endpoint_id=i)
        )
    except InvalidArgument as exc:  # disabled
        return error(request, 409, f"No test event sent: {exc.problem}.")
    if sent is None:
        return error(request, 404, NO_ENDPOINT)
    log_action(request, "endpoint_test_event", 1, endpoint_id=endpoint_id, message_id=sent)
    raise web.HTTPSeeOther(f"{_base(request)}deliveries/{sent}")


async def delete(request: web.Request) -> web.StreamResponse:
    """Delete the endpoint once confirmed: its messages not yet delivered are
    not sent (they become dead), its delivered history is kept."""
    try:
        endpoint_id = route_id(request)
        confirmed = read_choice(await read_form(request), "confirm", (DELETE,))
    except BadInput as exc:
        return error(request, 400, str(exc))
    if confirmed is None:
        raise web.HTTPSeeOther(f"{_base(request)}endpoints/{endpoint_id}/delete")
    box = portal_of(request).dashboard.endpoints()
    count = await _owned(request, lambda conn, i: box.delete(conn, i))
    if count is None:
        return error(request, 404, NO_ENDPOINT)
    log_action(request, "endpoint_delete", count, endpoint_id=endpoint_id)
    raise web.HTTPSeeOther(f"{_base(request)}?deleted={endpoint_id}&count={count}")
