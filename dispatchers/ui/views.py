"""The pages and actions of the dashboard.

A page reads in one read-only transaction (:meth:`DashboardStore.read`) through the
library's operator functions where they answer (:func:`outbox.admin.status`,
:func:`~outbox.admin.message_show`, the dead-letter functions), and through the
web surfaces' reads (:mod:`dispatchers.store.web`, as the operator) where they
do not. An action writes in one transaction, logs who did what to how many messages, and
redirects to a page (so reloading that page repeats nothing). Input from the
query string or a form is checked first (:mod:`dispatchers.ui.fields`); a value
that cannot be meant is a 400 page naming the field, before anything runs. The
dead letters are in :mod:`dispatchers.ui.dead_pages`, the endpoint pages in
:mod:`dispatchers.ui.endpoint_pages` and their forms in
:mod:`dispatchers.ui.endpoint_forms`, the tenant pages in
:mod:`dispatchers.ui.tenant_pages`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode

from aiohttp import web

from dispatchers.store.web import activity
from dispatchers.store.web import endpoints as web_endpoints
from dispatchers.store.web import messages as web_messages
from dispatchers.store.web.messages import BODY_SCAN, MessageSummary
from dispatchers.ui.auth import Guard
from dispatchers.ui.charts import bars, per_hour, per_minute
from dispatchers.ui.dashboard import (
    bad,
    dashboard_of,
    log_action,
    read_form,
    render,
    set_session,
)
from dispatchers.ui.fields import (
    BadInput,
    read_id,
    read_moment,
    read_tenant,
    read_text,
    read_webhook_id,
    route_id,
)
from dispatchers.ui.limits import TABLE_ROWS
from dispatchers.ui.store import SEARCH_LIMIT, DashboardStore
from outbox.admin import (
    MessageInfo,
    dead_retry,
    message_cancel,
    message_show,
    replay_message,
    status,
)
from outbox.errors import InvalidArgument

STATIC = Path(__file__).parent / "static"
"""The style sheet and the refresh script, served from ``/static/``."""

STATES = ("ready", "running", "paused", "dead", "delivered")
"""The states a message search can filter on (``delivered``: the history)."""


# -- sign-in -----------------------------------------------------------------------


async def login_page(request: web.Request) -> web.StreamResponse:
    if not dashboard_of(request).guard.login_required:
        raise web.HTTPSeeOther("/")
    return render(request, "login.html", error=None)


async def login(request: web.Request) -> web.StreamResponse:
    """Sign in with the token. The attempt is counted before its form is read
    (:meth:`SignInLimit.reserve`), so attempts sent together cannot all pass the
    limit while each waits for its body; past the limit it is refused unread."""
    guard: Guard = dashboard_of(request).guard
    client = request.remote or "unknown"
    if not guard.sign_ins.reserve(client):
        return render(
            request,
            "login.html",
            status=429,
            error="Too many wrong tokens from this address: wait a minute, then try again.",
        )
    form = await read_form(request)
    given = form.get("token")
    if not isinstance(given, str) or not guard.accepts_token(given.strip()):
        return render(request, "login.html", status=403, error="That is not the token.")
    guard.sign_ins.succeeded(client)
    response = web.HTTPSeeOther("/")
    _, cookie = guard.new_session()
    set_session(response, cookie)
    raise response


# -- overview ------------------------------------------------------------------


async def overview(request: web.Request) -> web.StreamResponse:
    """The backlog, the charts, the dispatchers, and the endpoints that need
    attention: every endpoint's, or with ``tenant``, that tenant's only."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        tenant = read_tenant(request.query)
    except BadInput as exc:
        return bad(request, exc)

    def read(conn: Any) -> tuple[dict[str, Any], Any, Any, Any, _Attention]:
        snapshot = status(conn, schema=store.schema)
        hour = snapshot["now"].astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        hours = store.hours(conn, until=hour)
        return (
            snapshot,
            activity.minutes(conn, store.schema),
            hours,
            activity.owners(conn, store.schema),
            _attention(conn, store, snapshot, tenant),
        )

    snapshot, minutes, hours, owners, attention = await store.read(read)
    now = snapshot["now"].astimezone(UTC)
    buckets = per_minute(minutes, now=now)
    hour = now.replace(minute=0, second=0, microsecond=0)
    this_hour = [b for b in buckets if b.minute >= hour]  # the minutes cover it
    current = (hour, sum(b.delivered for b in this_hour), sum(b.failed for b in this_hour))
    day = per_hour([*hours, current], now=now)
    return render(
        request,
        "overview.html",
        counts=snapshot["messages"],
        oldest=snapshot["oldest_ready_age_s"],
        chart=bars(buckets),
        delivered=sum(b.delivered for b in buckets),
        failed=sum(b.failed for b in buckets),
        day_chart=bars(day, label="Deliveries and failures per hour, last day", tick_every=6),
        day_delivered=sum(b.delivered for b in day),
        day_failed=sum(b.failed for b in day),
        owners=owners,
        attention=attention.rows,
        attention_count=attention.total,
        attention_more=attention.more,
        tenants=attention.tenants,
        tenant=tenant,
        unknown_tenant=attention.unknown_tenant,
        health=snapshot["destination_health"][:TABLE_ROWS],
        health_count=len(snapshot["destination_health"]),
        policed=snapshot["destinations"][:TABLE_ROWS],
        policed_count=len(snapshot["destinations"]),
        now=now,
    )


class _Attention(NamedTuple):
    """The overview's endpoints that need attention: the first
    :data:`TABLE_ROWS`, with their tenants."""

    rows: list[Any]
    total: int | None
    """How many need attention; None when filtered by tenant (then ``more``
    says whether there are others)."""
    more: bool
    tenants: dict[int, str]
    unknown_tenant: str | None


def _attention(
    conn: Any, store: DashboardStore, snapshot: dict[str, Any], tenant: str | None
) -> _Attention:
    """Every endpoint that needs attention comes with the snapshot; a tenant's
    (or those of no tenant) are read as the endpoints list reads them, a page."""
    if tenant is None:
        every = [
            e for e in snapshot["endpoints"] if not e["enabled"] or e["failure_streak"] or e["dead"]
        ]
        rows = every[:TABLE_ROWS]
        tenants = web_endpoints.tenants_of(conn, store.schema, [e["id"] for e in rows])
        return _Attention(rows, len(every), False, tenants, None)
    page = store.endpoint_page(conn, tenant=tenant, attention=True, limit=TABLE_ROWS + 1)
    shown = page[:TABLE_ROWS]
    tenants = {e.id: e.tenant for e in shown if e.tenant is not None}
    unknown = store.unknown_tenant(conn, tenant) if not shown else None
    return _Attention(shown, None, len(page) > TABLE_ROWS, tenants, unknown)


# -- messages ------------------------------------------------------------------


async def messages(request: web.Request) -> web.StreamResponse:
    """Messages matching the filters, :data:`SEARCH_LIMIT` a page, newest first;
    ``before``/``after``: the id the page starts below or above (keyset paging,
    the filters kept in the links)."""
    store = dashboard_of(request).store
    query = request.query
    try:
        message_id = read_id(query, "id")
        key = read_text(query, "key")
        event_type = read_text(query, "event_type")
        endpoint_id = read_id(query, "endpoint")
        state = read_text(query, "state")
        if state is not None and state not in STATES:
            raise BadInput(f"state: must be one of {', '.join(STATES)}")
        webhook_id, webhook_endpoint = read_webhook_id(query)
        created_from, created_until = read_moment(query, "from"), read_moment(query, "until")
        body = read_text(query, "body")
        tenant = read_tenant(query)
        before, after = read_id(query, "before"), read_id(query, "after")
        if before is not None and after is not None:
            raise BadInput("before: cannot be given with after")
    except BadInput as exc:
        return bad(request, exc)
    if message_id is not None:
        raise web.HTTPSeeOther(f"/messages/{message_id}")
    if webhook_id is not None:
        if key not in (None, webhook_id) or endpoint_id not in (None, webhook_endpoint):
            return bad(request, BadInput("webhook_id: differs from the key or endpoint given"))
        key, endpoint_id = webhook_id, webhook_endpoint

    def read(conn: Any) -> tuple[list[MessageSummary], str | None]:
        scope = store.tenant_filter(conn, tenant)
        if scope is None:
            return [], store.unknown_tenant(conn, tenant)
        tenant_id, untenanted = scope
        found = web_messages.search(
            conn,
            store.schema,
            tenant_id=tenant_id,
            untenanted=untenanted,
            key=key,
            event_type=event_type,
            endpoint_id=endpoint_id,
            state=state,
            created_from=created_from,
            created_until=created_until,
            body=body,
            before=before,
            after=after,
            limit=SEARCH_LIMIT + 1,  # one more: whether there is another page
        )
        return found, store.unknown_tenant(conn, tenant) if not found else None

    found, unknown_tenant = await store.read(read)
    more = len(found) > SEARCH_LIMIT
    found = found[-SEARCH_LIMIT:] if after is not None else found[:SEARCH_LIMIT]
    filters = {
        "key": key,
        "event_type": event_type,
        "endpoint": endpoint_id,
        "state": state,
        "from": read_text(query, "from"),
        "until": read_text(query, "until"),
        "body": body,
        "tenant": tenant,
    }
    kept = {k: str(v) for k, v in filters.items() if v is not None}
    older = newer = None
    if found and (more if after is None else True):
        older = urlencode({**kept, "before": found[-1].id})
    if after is not None and more and found:
        newer = urlencode({**kept, "after": found[0].id})
    elif before is not None:
        newer = urlencode({**kept, "after": found[0].id}) if found else urlencode(kept)
    return render(
        request,
        "messages.html",
        found=found,
        states=STATES,
        query=filters,
        older=older,
        newer=newer,
        newest=urlencode(kept) if (before is not None or after is not None) else None,
        page_size=SEARCH_LIMIT,
        body_scan=BODY_SCAN,
        unknown_tenant=unknown_tenant,
    )


async def _message_page(request: web.Request, *, revealed: bool) -> web.StreamResponse:
    store = dashboard_of(request).store
    try:
        message_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)

    def read(conn: Any) -> tuple[MessageInfo | None, str | None]:
        message = message_show(conn, message_id, schema=store.schema)
        if message is None or message.endpoint_id is None:
            return message, None
        tenants = web_endpoints.tenants_of(conn, store.schema, [message.endpoint_id])
        return message, tenants.get(message.endpoint_id)

    message, tenant = await store.read(read)
    if message is None:
        return render(
            request,
            "error.html",
            status=404,
            message=f"No message with id {message_id} (never written, or purged).",
        )
    if revealed:
        log_action(dashboard_of(request), "reveal", 1, message_id=message_id)
    body = None
    if revealed:
        try:
            body = message.body.decode("utf-8")
        except UnicodeDecodeError:
            body = "(binary) " + message.body.hex()
    return render(
        request,
        "message.html",
        message=message,
        tenant=tenant,
        revealed=revealed,
        body=body,
        notice=None if revealed else _message_notice(request.query),
    )


_MESSAGE_DONE = {
    "retry": ("Sent again: it is ready for the next claim.", "It was not dead: nothing retried."),
    "replay": ("Replayed: it is ready for the next claim.", "It was not delivered: nothing sent."),
    "cancel": (
        "Cancelled: it is dead and will not be sent unless retried.",
        "It was not waiting (a dispatcher holds it, or it ended): nothing cancelled.",
    ),
}


def _message_notice(fields: Mapping[str, Any]) -> str | None:
    """What a message's page says after an action redirected to it."""
    done, count = fields.get("done"), fields.get("count")
    if done not in _MESSAGE_DONE or count not in ("0", "1"):
        return None
    succeeded, passed_over = _MESSAGE_DONE[done]
    return succeeded if count == "1" else passed_over


async def message(request: web.Request) -> web.StreamResponse:
    return await _message_page(request, revealed=False)


async def message_reveal(request: web.Request) -> web.StreamResponse:
    return await _message_page(request, revealed=True)


async def message_retry(request: web.Request) -> web.StreamResponse:
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        message_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)
    count = await store.write(lambda conn: dead_retry(conn, schema=store.schema, ids=[message_id]))
    log_action(dashboard, "retry", count, message_id=message_id)
    raise web.HTTPSeeOther(f"/messages/{message_id}?done=retry&count={count}")


async def cancel_message(request: web.Request) -> web.StreamResponse:
    """Cancel a waiting message (:func:`outbox.admin.message_cancel`): ready,
    scheduled or paused, never one a dispatcher holds."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        message_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)
    cancelled = await store.write(
        lambda conn: message_cancel(conn, [message_id], schema=store.schema)
    )
    log_action(dashboard, "cancel", len(cancelled), message_id=message_id)
    raise web.HTTPSeeOther(f"/messages/{message_id}?done=cancel&count={len(cancelled)}")


async def message_replay(request: web.Request) -> web.StreamResponse:
    """Send one delivered webhook message again (:func:`outbox.admin.replay_message`:
    same id, same ``webhook-id``)."""
    dashboard = dashboard_of(request)
    store = dashboard.store
    try:
        message_id = route_id(request)
    except BadInput as exc:
        return bad(request, exc)
    try:
        replayed = await store.write(
            lambda conn: replay_message(conn, schema=store.schema, message_id=message_id)
        )
    except InvalidArgument as exc:
        return bad(request, exc)
    log_action(dashboard, "replay_message", int(replayed), message_id=message_id)
    raise web.HTTPSeeOther(f"/messages/{message_id}?done=replay&count={int(replayed)}")


# -- dead letters --------------------------------------------------------------
