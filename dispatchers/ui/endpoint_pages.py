"""The endpoint pages and actions of the dashboard: the list with each one's
health, one endpoint's last hour, and the changes an operator makes (add one,
enable, disable, edit its settings, delete it, rotate its secret, replay its
history, send it a test event). They follow the rules of
:mod:`dispatchers.ui.views`; every change goes through
:class:`outbox.endpoints.Endpoints`, which checks each field and names the one it
refuses, and the form is shown again with that field marked, nothing written.

Signing secrets are shown as fingerprints, opened with the dashboard's keyring;
a secret sealed under a key the dashboard was not given shows as sealed, and a
change that needs it (an edit, a rotation) is refused saying so
(:func:`dispatchers.ui.app._refusals`), so the pages never depend on the key.
The list is read a page at a time (:data:`~dispatchers.ui.limits.ENDPOINTS_PAGE`
endpoints, after an id), however many endpoints there are.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from dispatchers.store.web import activity
from dispatchers.store.web import attempts as web_attempts
from dispatchers.store.web import endpoints as web_endpoints
from dispatchers.store.web.endpoints import Listed, shown_secrets
from dispatchers.ui.dashboard import bad, dashboard_of, log_action, read_form, render
from dispatchers.ui.endpoint_forms import PLAIN_REFUSED, form_values
from dispatchers.ui.fields import (
    SPANS,
    BadInput,
    read_choice,
    read_id,
    read_since,
    read_tenant,
    read_text,
    route_id,
)
from dispatchers.ui.limits import ENDPOINTS_PAGE
from dispatchers.ui.policy_text import (
    auth_fields,
    format_duration,
    format_schedule,
    rate_text,
    tls_fields,
)
from outbox.admin import replay, send_test_event
from outbox.endpoints import DEFAULT_ROTATION_OVERLAP, Endpoint
from outbox.errors import InvalidArgument
from outbox.internal import EndpointRow
from outbox.retention_rules import RetentionRule, RetentionRules
from outbox.secrets import fingerprint, generate_secret

DISABLED_HERE = "disabled from the dashboard"
"""The reason an endpoint disabled here is given when the operator gives none."""


ATTENTION = ("1",)
"""The value of ``attention`` that lists only the endpoints that need it."""


async def endpoints(request: web.Request) -> web.StreamResponse:
    """One page of the endpoints, by id, with their health and backlog; secrets as
    fingerprints only. ``after``: the last id of the page before; ``attention=1``:
    only those disabled, failing or with dead messages; ``tenant``: only those of
    that tenant (or of none, ``-``)."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        after = read_id(request.query, "after") or 0
        attention = read_choice(request.query, "attention", ATTENTION) is not None
        tenant = read_tenant(request.query)
    except BadInput as exc:
        return bad(request, exc)

    def read(conn: Any) -> tuple[list[Listed], dict[int, Any], str | None]:
        page = store.endpoint_page(
            conn, tenant=tenant, after=after, attention=attention, limit=ENDPOINTS_PAGE + 1
        )
        unknown = store.unknown_tenant(conn, tenant) if not page else None
        return page, activity.endpoints_hour(conn, store.schema), unknown

    rows, hours, unknown_tenant = await store.read(read)
    more, rows = len(rows) > ENDPOINTS_PAGE, rows[:ENDPOINTS_PAGE]
    filters = {"attention": "1"} if attention else {}
    if tenant is not None:
        filters["tenant"] = tenant
    following = urlencode({**filters, "after": rows[-1].id}) if more else None
    return render(
        request,
        "endpoints.html",
        rows=rows,
        hours={e.id: hours[e.id] for e in rows if e.id in hours},
        secrets={e.id: shown_secrets(e.secrets, e.id, dashboard.keyring) for e in rows},
        attention=attention,
        tenant=tenant,
        unknown_tenant=unknown_tenant,
        tenant_query=urlencode({"tenant": tenant}) if tenant is not None else "",
        first=urlencode(filters) if after else None,
        following=following,
        page_size=ENDPOINTS_PAGE,
        notice=_list_notice(request.query),
    )


def _list_notice(fields: Mapping[str, Any]) -> str | None:
    """What the list says after an endpoint was deleted."""
    done, endpoint_id, count = fields.get("done"), fields.get("id", ""), fields.get("count", "")
    if done != "delete" or not all(v.isascii() and v.isdigit() for v in (endpoint_id, count)):
        return None
    return (
        f"Deleted endpoint {int(endpoint_id)}; its {int(count)} message(s) not yet delivered "
        "are dead (its delivered history is kept)."
    )


async def endpoint_toggle(request: web.Request) -> web.StreamResponse:
    """Enable an endpoint (its paused messages resume) or disable it (its waiting
    messages pause)."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    action = request.match_info["action"]
    try:
        endpoint_id = route_id(request)
        reason = read_text(await read_form(request), "reason") or DISABLED_HERE
    except BadInput as exc:
        return bad(request, exc)
    box = dashboard.endpoints()

    def toggle(conn: Any) -> int:
        if action == "enable":
            return box.enable(conn, endpoint_id)
        return box.disable(conn, endpoint_id, reason=reason)

    count = await store.write(toggle)
    log_action(dashboard, f"endpoint_{action}", count, endpoint_id=endpoint_id)
    # the page of the list that starts with it
    raise web.HTTPSeeOther(f"/endpoints?after={endpoint_id - 1}#endpoint-{endpoint_id}")


async def endpoint(request: web.Request) -> web.StreamResponse:
    """One endpoint: its settings and health, and its last hour of attempts."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)

    def read(conn: Any) -> tuple[EndpointRow | None, Any, Any, Any, RetentionRule | None]:
        row = web_endpoints.stored(conn, store.schema, endpoint_id)
        if row is None:
            return None, None, None, None, None
        return (
            row,
            activity.endpoint_hour(conn, store.schema, endpoint_id),
            web_attempts.of_endpoint(conn, store.schema, endpoint_id, tenant_id=None),
            activity.destination_health(conn, store.schema, f"endpoint:{endpoint_id}"),
            RetentionRules(schema=store.schema).get(conn, endpoint_id=endpoint_id),
        )

    row, hour, attempts, health, rule = await store.read(read)
    if row is None:
        return render(request, "error.html", status=404, message=f"No endpoint {endpoint_id}.")
    found: Endpoint = row._replace(secrets=[]).endpoint(None)  # its secrets, shown apart
    return render(
        request,
        "endpoint.html",
        endpoint=found,
        hour=hour,
        attempts=attempts,
        secrets=shown_secrets(row.secrets, row.id, dashboard.keyring),
        rate=rate_text(found.rate_limit_per_s, found.burst),
        schedule=format_schedule(found.retry_schedule),
        tls=tls_fields(found),
        credentials=auth_fields(found),
        health=health,
        retention=format_duration(rule.payload_retention_s) if rule else None,
        erased_until=rule.erased_until if rule else None,
        spans=SPANS,
        notice=_endpoint_notice(request.query),
        values=form_values(found),
        error=None,
        error_field=None,
    )


def _endpoint_notice(fields: Mapping[str, Any]) -> str | None:
    """What an endpoint's page says after an action redirected to it."""
    done, count = fields.get("done"), fields.get("count", "")
    if done == "edit":
        return "Saved."
    if done == "replay" and count.isascii() and count.isdigit():
        return f"Replayed {int(count)} delivered message(s)."
    return None


ROTATE = "rotate"
"""The value of the ``confirm`` field that the confirmation page's button posts."""


async def endpoint_rotate_confirm(request: web.Request) -> web.StreamResponse:
    """What rotating the endpoint's secret does, and the button that does it: a
    rotation is one step further than a click on the endpoint's page."""
    store = dashboard_of(request).store
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)
    row = await store.read(lambda conn: web_endpoints.stored(conn, store.schema, endpoint_id))
    if row is None:
        return render(request, "error.html", status=404, message=f"No endpoint {endpoint_id}.")
    hours = DEFAULT_ROTATION_OVERLAP / timedelta(hours=1)
    return render(request, "rotate.html", endpoint=row, overlap_hours=hours, confirm=ROTATE)


async def endpoint_rotate(request: web.Request) -> web.StreamResponse:
    """Sign with a new secret, once confirmed (a form without ``confirm`` is sent
    to the confirmation page, nothing changed); the page that answers is the only
    page that shows it (not a redirect: reloading it does not show it again, and
    the log names its fingerprint only). Without a keyring where secrets are
    sealed, it is refused: the new secret would be stored in plain text."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        endpoint_id = route_id(request)
        confirmed = read_choice(await read_form(request), "confirm", (ROTATE,))
    except BadInput as exc:
        return bad(request, exc)
    if confirmed is None:
        raise web.HTTPSeeOther(f"/endpoints/{endpoint_id}/rotate-secret")
    box = dashboard.endpoints()
    secret = generate_secret()

    def rotate(conn: Any) -> Endpoint | None:
        if dashboard.keyring is None and web_endpoints.secrets_sealed(conn, store.schema):
            return None
        return box.rotate_secret(conn, endpoint_id, secret=secret)

    try:
        rotated = await store.write(rotate)
    except InvalidArgument as exc:
        return bad(request, exc)
    if rotated is None:
        message = PLAIN_REFUSED.format(what="rotate it")
        return render(request, "error.html", status=409, message=message)
    log_action(
        dashboard, "endpoint_rotate_secret", 1, endpoint_id=endpoint_id, new=fingerprint(secret)
    )
    hours = DEFAULT_ROTATION_OVERLAP / timedelta(hours=1)
    return render(request, "rotated.html", endpoint=rotated, secret=secret, overlap_hours=hours)


async def endpoint_replay(request: web.Request) -> web.StreamResponse:
    """Send an endpoint's messages delivered since a span ago again
    (:func:`outbox.admin.replay`: same ids, same ``webhook-id``)."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        endpoint_id = route_id(request)
        since = read_since(await read_form(request))
        if since is None:
            raise BadInput("since: required")
    except BadInput as exc:
        return bad(request, exc)
    try:
        count = await store.write(
            lambda conn: replay(conn, schema=store.schema, endpoint_id=endpoint_id, since=since)
        )
    except InvalidArgument as exc:
        return bad(request, exc)
    log_action(
        dashboard, "endpoint_replay", count, endpoint_id=endpoint_id, since=since.isoformat()
    )
    raise web.HTTPSeeOther(f"/endpoints/{endpoint_id}?done=replay&count={count}")


async def endpoint_test(request: web.Request) -> web.StreamResponse:
    """Send the endpoint a test event (:func:`outbox.admin.send_test_event`) and
    show its message, where its one attempt appears once a dispatcher made it."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)
    try:
        message_id = await store.write(
            lambda conn: send_test_event(conn, schema=store.schema, endpoint_id=endpoint_id)
        )
    except InvalidArgument as exc:
        return bad(request, exc)
    log_action(dashboard, "endpoint_test_event", 1, endpoint_id=endpoint_id, message_id=message_id)
    raise web.HTTPSeeOther(f"/messages/{message_id}")
