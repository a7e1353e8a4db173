"""The dashboard's web application: routes, the guard on every request, headers.

Pages are GET and read only; actions are POST, each checked for its CSRF token
before its handler runs, and in read-only mode their routes are never added (a
POST to one is a 405, not a refusal by a handler that might be forgotten).
Every response carries a Content-Security-Policy that allows scripts and styles
from the dashboard itself only, so no value from the database can run as script
even if one escaped a template.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from dispatchers.ui import endpoint_pages, views
from dispatchers.ui.auth import COOKIE
from dispatchers.ui.dashboard import DASHBOARD, SESSION, Dashboard, set_session

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The Content-Security-Policy of every response: no inline script, no framing."""

_OPEN_PATHS = ("/login", "/static/")
"""Served without a session (the login page and the style sheet it uses)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Host check, session, CSRF: in that order, before any handler runs."""
    dashboard = request.app[DASHBOARD]
    guard = dashboard.guard
    if not guard.allows_host(request.headers.get("Host")):
        raise web.HTTPMisdirectedRequest(text="this dashboard answers to loopback names only")
    if request.path.startswith(_OPEN_PATHS):
        return await handler(request)
    sid = guard.session_id(request.cookies.get(COOKIE))
    fresh = None
    if sid is None:
        if guard.login_required or request.method != "GET":
            if request.method == "GET":
                raise web.HTTPSeeOther("/login")
            raise web.HTTPForbidden(text="not signed in")
        sid, fresh = guard.new_session()
    request[SESSION] = sid
    if request.method == "POST":
        form = await request.post()
        given = form.get("csrf")
        if not guard.accepts_csrf(sid, given if isinstance(given, str) else None):
            raise web.HTTPForbidden(text="missing or wrong CSRF token; reload the page")
    response = await handler(request)
    if fresh is not None:
        set_session(response, fresh)
    return response


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    if not request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"


def build_app(dashboard: Dashboard) -> web.Application:
    """The application: pages always, actions unless read-only."""
    app = web.Application(middlewares=[_guard], client_max_size=64 * 1024)
    app[DASHBOARD] = dashboard
    app.on_response_prepare.append(_headers)
    app.router.add_get("/", views.overview)
    app.router.add_get("/login", views.login_page)
    app.router.add_post("/login", views.login)
    app.router.add_get("/messages", views.messages)
    app.router.add_get("/messages/{id}", views.message)
    app.router.add_get("/dead", views.dead)
    app.router.add_get("/endpoints", endpoint_pages.endpoints)
    app.router.add_get("/endpoints/{id}", endpoint_pages.endpoint)
    app.router.add_static("/static/", views.STATIC, append_version=True)
    if not dashboard.read_only:
        app.router.add_post("/messages/{id}/reveal", views.message_reveal)
        app.router.add_post("/messages/{id}/retry", views.message_retry)
        app.router.add_post("/messages/{id}/replay", views.message_replay)
        app.router.add_get("/dead/confirm", views.dead_confirm)
        app.router.add_post("/dead/{action:retry|purge}", views.dead_act)
        app.router.add_post(
            "/endpoints/{id}/{action:enable|disable}", endpoint_pages.endpoint_toggle
        )
        app.router.add_post("/endpoints/{id}/edit", endpoint_pages.endpoint_edit)
        app.router.add_post("/endpoints/{id}/rotate-secret", endpoint_pages.endpoint_rotate)
        app.router.add_post("/endpoints/{id}/replay", endpoint_pages.endpoint_replay)
        app.router.add_post("/endpoints/{id}/test", endpoint_pages.endpoint_test)
    return app


async def serve(
    dashboard: Dashboard,
    *,
    host: str,
    port: int,
    started: Callable[[str], Any] | None = None,
) -> None:
    """Serve until cancelled; ``started`` gets the URL once the socket listens and
    the day chart is read."""
    await asyncio.to_thread(dashboard.store.open)
    runner = web.AppRunner(build_app(dashboard), access_log=None)
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        url = f"http://{'[' + host + ']' if ':' in host else host}:{bound[1]}/"
        dashboard.log.event("ui_listening", url=url, read_only=dashboard.read_only)
        await _warm(dashboard)
        if started is not None:
            started(url)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await asyncio.to_thread(dashboard.store.close)


async def _warm(dashboard: Dashboard) -> None:
    """Read the day chart once while no page waits for it; if that fails, the
    first overview reads it instead (and says why, if it fails again)."""
    try:
        await dashboard.store.read(dashboard.store.warm)
    except Exception as exc:  # the pages still serve; the overview retries the read
        dashboard.log.event("ui_day_chart_unread", error=type(exc).__name__)
