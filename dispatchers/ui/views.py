"""The pages and actions of the dashboard.

A page reads in one read-only transaction (:meth:`Store.read`) through the
library's operator functions where they answer (:func:`outbox.admin.status`,
:func:`~outbox.admin.message_show`, the dead-letter functions), and through the
dashboard's own statements (``sql/queries/ui.sql``) where they do not. An
action writes in one transaction, logs who did what to how many messages, and
redirects to a page (so reloading that page repeats nothing). Input from the
query string or a form is checked here; a value that cannot be meant is a 400
page naming the field, before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from dispatchers.ui.auth import Guard
from dispatchers.ui.charts import bars, per_hour, per_minute
from dispatchers.ui.dashboard import DASHBOARD, Dashboard, render, set_session
from outbox._arguments import MAX_ID
from outbox.admin import (
    dead_count,
    dead_list,
    dead_purge,
    dead_retry,
    message_show,
    replay,
    status,
)
from outbox.endpoints import Endpoints
from outbox.errors import InvalidArgument
from outbox.secrets import fingerprint, generate_secret

STATIC = Path(__file__).parent / "static"
"""The style sheet and the refresh script, served from ``/static/``."""

STATES = ("ready", "running", "paused", "dead", "succeeded")
"""The states a message search can filter on (``succeeded``: the history)."""

SPANS = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
"""The "died since" choices of the dead-letter filters."""

DISABLED_HERE = "disabled from the dashboard"
"""The reason an endpoint disabled here is given when the operator gives none."""

DEAD_LIMIT = 100
"""The most dead messages one page lists."""

_TEXT_LIMIT = 1000


class BadInput(ValueError):
    """A query or form field that cannot be meant; the page says which."""


def _dashboard(request: web.Request) -> Dashboard:
    return request.app[DASHBOARD]


def _bad(request: web.Request, exc: BadInput) -> web.Response:
    return render(request, "error.html", status=400, message=str(exc))


# -- fields --------------------------------------------------------------------


def _text(fields: Mapping[str, Any], name: str) -> str | None:
    value = fields.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    if len(value) > _TEXT_LIMIT:
        raise BadInput(f"{name}: longer than {_TEXT_LIMIT} characters")
    return value.strip()


def _id(fields: Mapping[str, Any], name: str) -> int | None:
    value = _text(fields, name)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_ID:
        raise BadInput(f"{name}: {value[:40]!r} is not an id")
    return int(value)


def _route_id(request: web.Request) -> int:
    """The message or endpoint id of the route: present, since the route matched."""
    value = _id(request.match_info, "id")
    if value is None:
        raise BadInput("id: missing")
    return value


def _notice(fields: Mapping[str, Any]) -> str | None:
    """What the dead-letter page says after an action redirected to it."""
    done, count = fields.get("done"), fields.get("count", "")
    if done not in ("retry", "purge") or not count.isascii() or not count.isdigit():
        return None
    verb = "Retried" if done == "retry" else "Purged"
    return f"{verb} {int(count)} dead message(s)."


def _since(fields: Mapping[str, Any]) -> datetime | None:
    """``since``: one of :data:`SPANS` ago, or an ISO 8601 time with an offset (as a
    confirmation page passes the instant it counted from)."""
    value = _text(fields, "since")
    if value is None:
        return None
    if value in SPANS:
        return datetime.now(UTC) - SPANS[value]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(f"since: {value[:40]!r} is neither {', '.join(SPANS)} nor a time") from None
    if moment.utcoffset() is None:
        raise BadInput("since: the time has no UTC offset")
    return moment


def _moment(fields: Mapping[str, Any], name: str) -> datetime | None:
    """A time as a browser's date-and-time field sends it, read as UTC (the
    dashboard shows every time in UTC), or with an offset of its own."""
    value = _text(fields, name)
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(f"{name}: {value[:40]!r} is not a time (YYYY-MM-DDTHH:MM)") from None
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


def _webhook_id(fields: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """``webhook_id``, as a receiver logs it: the message's idempotency key,
    ``<event key>:<endpoint id>``; so the key and the endpoint to search."""
    value = _text(fields, "webhook_id")
    if value is None:
        return None, None
    _, _, endpoint = value.rpartition(":")
    if not endpoint.isascii() or not endpoint.isdigit() or not 1 <= int(endpoint) <= MAX_ID:
        raise BadInput(f"webhook_id: {value[:40]!r} does not end in :<endpoint id>")
    return value, int(endpoint)


def _dead_filters(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "endpoint_id": _id(fields, "endpoint"),
        "event_type": _text(fields, "event_type"),
        "since": _since(fields),
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
    }
    return {k: str(v) for k, v in fields.items() if v is not None}


def _log_action(dashboard: Dashboard, action: str, rows: int, **fields: Any) -> None:
    dashboard.log.event(
        "ui_action", who=dashboard.guard.principal, action=action, rows=rows, **fields
    )


# -- sign-in -----------------------------------------------------------------------


async def login_page(request: web.Request) -> web.StreamResponse:
    if not _dashboard(request).guard.login_required:
        raise web.HTTPSeeOther("/")
    return render(request, "login.html", error=None)


async def login(request: web.Request) -> web.StreamResponse:
    guard: Guard = _dashboard(request).guard
    client = request.remote or "unknown"
    if guard.sign_ins.blocked(client):
        return render(
            request,
            "login.html",
            status=429,
            error="Too many wrong tokens from this address: wait a minute, then try again.",
        )
    form = await request.post()
    given = form.get("token")
    if not isinstance(given, str) or not guard.accepts_token(given.strip()):
        guard.sign_ins.failed(client)
        return render(request, "login.html", status=403, error="That is not the token.")
    guard.sign_ins.succeeded(client)
    response = web.HTTPSeeOther("/")
    _, cookie = guard.new_session()
    set_session(response, cookie)
    raise response


# -- overview ------------------------------------------------------------------


async def overview(request: web.Request) -> web.StreamResponse:
    dashboard = _dashboard(request)
    store = dashboard.store

    def read(conn: Any) -> tuple[dict[str, Any], Any, Any, Any]:
        snapshot = status(conn, schema=store.schema)
        return snapshot, store.minutes(conn), store.hours(conn), store.owners(conn)

    snapshot, minutes, hours, owners = await store.read(read)
    now = snapshot["now"].astimezone(UTC)
    buckets = per_minute(minutes, now=now)
    day = per_hour(hours, now=now)
    attention = [
        e for e in snapshot["endpoints"] if not e["enabled"] or e["failure_streak"] or e["dead"]
    ]
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
        attention=attention,
        now=now,
    )


# -- messages ------------------------------------------------------------------


async def messages(request: web.Request) -> web.StreamResponse:
    store = _dashboard(request).store
    query = request.query
    try:
        message_id = _id(query, "id")
        key = _text(query, "key")
        event_type = _text(query, "event_type")
        endpoint_id = _id(query, "endpoint")
        state = _text(query, "state")
        if state is not None and state not in STATES:
            raise BadInput(f"state: must be one of {', '.join(STATES)}")
        webhook_id, webhook_endpoint = _webhook_id(query)
        created_from, created_until = _moment(query, "from"), _moment(query, "until")
    except BadInput as exc:
        return _bad(request, exc)
    if message_id is not None:
        raise web.HTTPSeeOther(f"/messages/{message_id}")
    if webhook_id is not None:
        if key not in (None, webhook_id) or endpoint_id not in (None, webhook_endpoint):
            return _bad(request, BadInput("webhook_id: differs from the key or endpoint given"))
        key, endpoint_id = webhook_id, webhook_endpoint
    found = await store.read(
        lambda conn: store.search(
            conn,
            key=key,
            event_type=event_type,
            endpoint_id=endpoint_id,
            state=state,
            created_from=created_from,
            created_until=created_until,
        )
    )
    return render(
        request,
        "messages.html",
        found=found,
        states=STATES,
        query={
            "key": key,
            "event_type": event_type,
            "endpoint": endpoint_id,
            "state": state,
            "from": _text(query, "from"),
            "until": _text(query, "until"),
        },
    )


async def _message_page(request: web.Request, *, revealed: bool) -> web.StreamResponse:
    store = _dashboard(request).store
    try:
        message_id = _route_id(request)
    except BadInput as exc:
        return _bad(request, exc)
    message = await store.read(lambda conn: message_show(conn, message_id, schema=store.schema))
    if message is None:
        return render(
            request,
            "error.html",
            status=404,
            message=f"No message with id {message_id} (never written, or purged).",
        )
    if revealed:
        _log_action(_dashboard(request), "reveal", 1, message_id=message_id)
    body = None
    if revealed:
        try:
            body = message.body.decode("utf-8")
        except UnicodeDecodeError:
            body = "(binary) " + message.body.hex()
    return render(request, "message.html", message=message, revealed=revealed, body=body)


async def message(request: web.Request) -> web.StreamResponse:
    return await _message_page(request, revealed=False)


async def message_reveal(request: web.Request) -> web.StreamResponse:
    return await _message_page(request, revealed=True)


async def message_retry(request: web.Request) -> web.StreamResponse:
    dashboard = _dashboard(request)
    store = dashboard.store
    try:
        message_id = _route_id(request)
    except BadInput as exc:
        return _bad(request, exc)
    count = await store.write(lambda conn: dead_retry(conn, schema=store.schema, ids=[message_id]))
    _log_action(dashboard, "retry", count, message_id=message_id)
    raise web.HTTPSeeOther(f"/messages/{message_id}")


# -- dead letters --------------------------------------------------------------


async def dead(request: web.Request) -> web.StreamResponse:
    store = _dashboard(request).store
    try:
        filters = _dead_filters(request.query)
    except BadInput as exc:
        return _bad(request, exc)
    rows = await store.read(
        lambda conn: dead_list(conn, schema=store.schema, limit=DEAD_LIMIT, **filters)
    )
    return render(
        request,
        "dead.html",
        rows=rows,
        limit=DEAD_LIMIT,
        spans=SPANS,
        query={
            "endpoint": filters["endpoint_id"],
            "event_type": filters["event_type"],
            "since": _text(request.query, "since"),
        },
        filter_query=urlencode(_filter_query(filters)),
        notice=_notice(request.query),
    )


async def dead_confirm(request: web.Request) -> web.StreamResponse:
    store = _dashboard(request).store
    action = request.query.get("action")
    try:
        if action not in ("retry", "purge"):
            raise BadInput("action: must be retry or purge")
        filters = _dead_filters(request.query)
    except BadInput as exc:
        return _bad(request, exc)
    count = await store.read(
        lambda conn: dead_count(conn, schema=store.schema, **_selection(filters))
    )
    return render(
        request,
        "confirm.html",
        action=action,
        count=count,
        filters=filters,
        fields=_filter_query(filters),
    )


async def dead_act(request: web.Request) -> web.StreamResponse:
    dashboard = _dashboard(request)
    store = dashboard.store
    action = request.match_info["action"]
    try:
        filters = _dead_filters(await request.post())
    except BadInput as exc:
        return _bad(request, exc)
    selection = _selection(filters)
    act = dead_retry if action == "retry" else dead_purge
    count = await store.write(lambda conn: act(conn, schema=store.schema, **selection))
    _log_action(dashboard, f"dead_{action}", count, **_filter_query(filters))
    query = {**_filter_query(filters), "done": action, "count": str(count)}
    raise web.HTTPSeeOther("/dead?" + urlencode(query))


# -- endpoints -----------------------------------------------------------------


async def endpoints(request: web.Request) -> web.StreamResponse:
    """Every endpoint with its health and backlog; secrets as fingerprints only."""
    store = _dashboard(request).store

    def read(conn: Any) -> tuple[Any, dict[int, dict[str, Any]]]:
        counts = {e["id"]: e for e in status(conn, schema=store.schema)["endpoints"]}
        return Endpoints(schema=store.schema).all(conn), counts

    rows, counts = await store.read(read)
    return render(
        request,
        "endpoints.html",
        rows=rows,
        counts=counts,
        fingerprints={e.id: [fingerprint(s.secret) for s in e.secrets] for e in rows},
    )


async def endpoint_toggle(request: web.Request) -> web.StreamResponse:
    """Enable an endpoint (its paused messages resume) or disable it (its waiting
    messages pause)."""
    dashboard = _dashboard(request)
    store = dashboard.store
    action = request.match_info["action"]
    try:
        endpoint_id = _route_id(request)
        reason = _text(await request.post(), "reason") or DISABLED_HERE
    except BadInput as exc:
        return _bad(request, exc)
    box = Endpoints(schema=store.schema)

    def toggle(conn: Any) -> int:
        if action == "enable":
            return box.enable(conn, endpoint_id)
        return box.disable(conn, endpoint_id, reason=reason)

    count = await store.write(toggle)
    _log_action(dashboard, f"endpoint_{action}", count, endpoint_id=endpoint_id)
    raise web.HTTPSeeOther(f"/endpoints#endpoint-{endpoint_id}")


async def endpoint(request: web.Request) -> web.StreamResponse:
    """One endpoint: its settings and health, and its last hour of attempts."""
    store = _dashboard(request).store
    try:
        endpoint_id = _route_id(request)
    except BadInput as exc:
        return _bad(request, exc)

    def read(conn: Any) -> tuple[Any, Any, Any]:
        found = Endpoints(schema=store.schema).get(conn, endpoint_id)
        if found is None:
            return None, None, None
        return (
            found,
            store.endpoint_hour(conn, endpoint_id),
            store.endpoint_attempts(conn, endpoint_id),
        )

    found, hour, attempts = await store.read(read)
    if found is None:
        return render(request, "error.html", status=404, message=f"No endpoint {endpoint_id}.")
    return render(
        request,
        "endpoint.html",
        endpoint=found,
        hour=hour,
        attempts=attempts,
        fingerprints=[fingerprint(s.secret) for s in found.secrets],
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


def _cap(fields: Mapping[str, Any]) -> int | None:
    """``cap``: the most deliveries in flight at once, or None (empty) for no cap."""
    value = _text(fields, "cap")
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= 10_000:
        raise BadInput(f"cap: {value[:40]!r} is not a number from 1 to 10000")
    return int(value)


async def endpoint_edit(request: web.Request) -> web.StreamResponse:
    """Replace an endpoint's event types (one per line or comma-separated; none
    for every type) and its cap (empty for none)."""
    dashboard = _dashboard(request)
    store = dashboard.store
    form = await request.post()
    try:
        endpoint_id = _route_id(request)
        cap = _cap(form)
        event_types = (_text(form, "event_types") or "").replace(",", " ").split()
    except BadInput as exc:
        return _bad(request, exc)
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
        return _bad(request, BadInput(str(exc)))
    _log_action(
        dashboard, "endpoint_edit", 1, endpoint_id=endpoint_id, event_types=event_types, cap=cap
    )
    raise web.HTTPSeeOther(f"/endpoints/{endpoint_id}?done=edit")


async def endpoint_rotate(request: web.Request) -> web.StreamResponse:
    """Sign with a new secret; the page that answers is the only place it is
    shown (not a redirect: reloading it does not show it again, and the log
    names its fingerprint only)."""
    dashboard = _dashboard(request)
    store = dashboard.store
    try:
        endpoint_id = _route_id(request)
    except BadInput as exc:
        return _bad(request, exc)
    box = Endpoints(schema=store.schema)
    secret = generate_secret()
    try:
        rotated = await store.write(
            lambda conn: box.rotate_secret(conn, endpoint_id, secret=secret)
        )
    except InvalidArgument as exc:
        return _bad(request, BadInput(str(exc)))
    _log_action(
        dashboard, "endpoint_rotate_secret", 1, endpoint_id=endpoint_id, new=fingerprint(secret)
    )
    return render(request, "rotated.html", endpoint=rotated, secret=secret)


async def endpoint_replay(request: web.Request) -> web.StreamResponse:
    """Send an endpoint's messages delivered since a span ago again
    (:func:`outbox.admin.replay`: same ids, same ``webhook-id``)."""
    dashboard = _dashboard(request)
    store = dashboard.store
    try:
        endpoint_id = _route_id(request)
        since = _since(await request.post())
        if since is None:
            raise BadInput("since: required")
    except BadInput as exc:
        return _bad(request, exc)
    try:
        count = await store.write(
            lambda conn: replay(conn, schema=store.schema, endpoint_id=endpoint_id, since=since)
        )
    except InvalidArgument as exc:
        return _bad(request, BadInput(str(exc)))
    _log_action(
        dashboard, "endpoint_replay", count, endpoint_id=endpoint_id, since=since.isoformat()
    )
    raise web.HTTPSeeOther(f"/endpoints/{endpoint_id}?done=replay&count={count}")
