"""The endpoint pages and actions of the dashboard: the list with each one's
health, one endpoint's last hour, and the changes an operator makes to it
(enable, disable, edit, rotate its secret, replay its history, send it a test
event). They follow the
rules of :mod:`dispatchers.ui.views`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from aiohttp import web

from dispatchers.policy_text import format_schedule, rate_text, tls_fields
from dispatchers.ui.dashboard import bad, dashboard_of, log_action, render
from dispatchers.ui.fields import SPANS, BadInput, read_cap, read_since, read_text, route_id
from outbox.admin import replay, send_test_event, status
from outbox.endpoints import DEFAULT_ROTATION_OVERLAP, Endpoints
from outbox.errors import InvalidArgument
from outbox.secrets import fingerprint, generate_secret

DISABLED_HERE = "disabled from the dashboard"
"""The reason an endpoint disabled here is given when the operator gives none."""


async def endpoints(request: web.Request) -> web.StreamResponse:
    """Every endpoint with its health and backlog; secrets as fingerprints only."""
    store = dashboard_of(request).store

    def read(conn: Any) -> tuple[Any, dict[int, dict[str, Any]], dict[int, Any]]:
        counts = {e["id"]: e for e in status(conn, schema=store.schema)["endpoints"]}
        return Endpoints(schema=store.schema).all(conn), counts, store.endpoints_hour(conn)

    rows, counts, hours = await store.read(read)
    return render(
        request,
        "endpoints.html",
        rows=rows,
        counts=counts,
        hours=hours,
        fingerprints={e.id: [fingerprint(s.secret) for s in e.secrets] for e in rows},
    )


async def endpoint_toggle(request: web.Request) -> web.StreamResponse:
    """Enable an endpoint (its paused messages resume) or disable it (its waiting
    messages pause)."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    action = request.match_info["action"]
    try:
        endpoint_id = route_id(request)
        reason = read_text(await request.post(), "reason") or DISABLED_HERE
    except BadInput as exc:
        return bad(request, exc)
    box = Endpoints(schema=store.schema)

    def toggle(conn: Any) -> int:
        if action == "enable":
            return box.enable(conn, endpoint_id)
        return box.disable(conn, endpoint_id, reason=reason)

    count = await store.write(toggle)
    log_action(dashboard, f"endpoint_{action}", count, endpoint_id=endpoint_id)
    raise web.HTTPSeeOther(f"/endpoints#endpoint-{endpoint_id}")


async def endpoint(request: web.Request) -> web.StreamResponse:
    """One endpoint: its settings and health, and its last hour of attempts."""
    store = dashboard_of(request).store
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)

    def read(conn: Any) -> tuple[Any, Any, Any, Any]:
        found = Endpoints(schema=store.schema).get(conn, endpoint_id)
        if found is None:
            return None, None, None, None
        return (
            found,
            store.endpoint_hour(conn, endpoint_id),
            store.endpoint_attempts(conn, endpoint_id),
            store.destination_health(conn, f"endpoint:{endpoint_id}"),
        )

    found, hour, attempts, health = await store.read(read)
    if found is None:
        return render(request, "error.html", status=404, message=f"No endpoint {endpoint_id}.")
    return render(
        request,
        "endpoint.html",
        endpoint=found,
        hour=hour,
        attempts=attempts,
        fingerprints=[fingerprint(s.secret) for s in found.secrets],
        rate=rate_text(found.rate_limit_per_s, found.burst),
        schedule=format_schedule(found.retry_schedule),
        tls=tls_fields(found),
        health=health,
        spans=SPANS,
        notice=_endpoint_notice(request.query),
    )


def _endpoint_notice(fields: Mapping[str, Any]) -> str | None:
    """What an endpoint's page says after an action redirected to it."""
    done, count = fields.get("done"), fields.get("count", "")
    if done == "edit":
        return "Saved."
    if done == "replay" and count.isascii() and count.isdigit():
        return f"Replayed {int(count)} delivered message(s)."
    return None


async def endpoint_edit(request: web.Request) -> web.StreamResponse:
    """Replace an endpoint's event types (one per line or comma-separated; none
    for every type) and its cap (empty for none)."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    form = await request.post()
    try:
        endpoint_id = route_id(request)
        cap = read_cap(form)
        event_types = (read_text(form, "event_types") or "").replace(",", " ").split()
    except BadInput as exc:
        return bad(request, exc)
    box = Endpoints(schema=store.schema)
    try:
        await store.write(
            lambda conn: box.update(
                conn,
                endpoint_id,
                event_types=event_types,
                max_concurrency=cap,
                clear_max_concurrency=cap is None,
            )
        )
    except InvalidArgument as exc:
        return bad(request, exc)
    log_action(
        dashboard, "endpoint_edit", 1, endpoint_id=endpoint_id, event_types=event_types, cap=cap
    )
    raise web.HTTPSeeOther(f"/endpoints/{endpoint_id}?done=edit")


async def endpoint_rotate(request: web.Request) -> web.StreamResponse:
    """Sign with a new secret; the page that answers is the only place it is
    shown (not a redirect: reloading it does not show it again, and the log
    names its fingerprint only)."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        endpoint_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)
    box = Endpoints(schema=store.schema)
    secret = generate_secret()
    try:
        rotated = await store.write(
            lambda conn: box.rotate_secret(conn, endpoint_id, secret=secret)
        )
    except InvalidArgument as exc:
        return bad(request, exc)
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
        since = read_since(await request.post())
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
