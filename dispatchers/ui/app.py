"""The dashboard's web application: routes, the guard on every request, headers.

Pages are GET and read only; actions are POST, each checked for its CSRF token
before its handler runs, and in read-only mode their routes are never added (a
POST to one is a 405, not a refusal by a handler that might be forgotten).
Every response carries a Content-Security-Policy that allows scripts and styles
from the dashboard itself only, so no value from the database can run as script
even if one escaped a template.

The server bounds what a connection can hold (:class:`~dispatchers.ui.dashboard.Limits`):
at most so many connections at once (past that, a 503 and the connection closed),
a deadline for a request's headers and one for its form. Running out of file
descriptors, or refusing connections, is logged at most once a minute, never a
traceback per connection.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import psycopg
from aiohttp import web

from dispatchers.api.app import RETRY_AFTER, build_api, is_api_path, problems
from dispatchers.api.calls import PREFIX, Api
from dispatchers.runtime.log import EventLog
from dispatchers.store.sqlstates import is_unreachable
from dispatchers.ui import dead_pages, endpoint_forms, endpoint_pages, tenant_pages, views
from dispatchers.ui.auth import COOKIE
from dispatchers.ui.dashboard import (
    DASHBOARD,
    SESSION,
    Dashboard,
    read_form,
    render,
    set_session,
)
from outbox.sealing import SealBroken, SecretKeyMissing

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The Content-Security-Policy of every response: no inline script, no framing."""

UNREACHABLE = (
    "The database is unreachable, so this page cannot be shown. Try again in a "
    "moment: the dashboard serves again as soon as the database answers."
)
"""The page of a request that needs the database while it cannot be reached (503)."""

_OPEN_PATHS = ("/login", "/static/")
"""Served without a session (the login page and the style sheet it uses)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Host check, session, CSRF: in that order, before any handler runs. The
    API authenticates its own requests (a bearer token on each)."""
    if is_api_path(request.path):
        return await handler(request)
    dashboard = request.app[DASHBOARD]
    guard = dashboard.guard
    if not guard.allows_host(request.headers.get("Host")):
        raise web.HTTPMisdirectedRequest(text="this dashboard answers to loopback names only")
    if request.path.startswith(_OPEN_PATHS):
        return await handler(request)
    if len(request.match_info.apps) > 1:
        # a sub-application mounted here (the consumer portal) guards its own requests
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
        form = await read_form(request)
        given = form.get("csrf")
        if not guard.accepts_csrf(sid, given if isinstance(given, str) else None):
            raise web.HTTPForbidden(text="missing or wrong CSRF token; reload the page")
    response = await handler(request)
    if fresh is not None:
        set_session(response, fresh)
    return response


@web.middleware
async def _refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What a handler could not do, as a page that says why, not a 500: a secret
    sealed under a key the dashboard was not given (409), a value the
    database cannot take (400; the fields are checked first, so this is a
    last resort, classified by SQLSTATE class 22), and a database that cannot be
    reached (503). The API, and the consumer portal, answer their own."""
    if is_api_path(request.path):
        return await handler(request)
    try:
        return await handler(request)
    except SecretKeyMissing as exc:
        message = (
            f"This endpoint's signing secret is sealed under key {exc.key_id}, which this "
            "dashboard was not given: start outbox ui with --secrets-key-file (or "
            "OUTBOX_SECRETS_KEY) holding that key to make this change."
        )
        return render(request, "error.html", status=409, message=message)
    except SealBroken as exc:
        message = (
            f"This endpoint's signing secret does not open under key {exc.key_id}: it was "
            "altered or copied from another endpoint. Rotate it with outbox endpoints."
        )
        return render(request, "error.html", status=409, message=message)
    except psycopg.errors.DataError as exc:
        request.app[DASHBOARD].log.event("ui_bad_value", path=request.path, sqlstate=exc.sqlstate)
        message = "A value of this request is one the database cannot take."
        return render(request, "error.html", status=400, message=message)
    except psycopg.Error as exc:
        if not is_unreachable(exc):
            raise
        response = render(request, "error.html", status=503, message=UNREACHABLE)
        response.headers["Retry-After"] = str(RETRY_AFTER)
        return response


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    if not request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "no-store"


def build_app(
    dashboard: Dashboard, *, mounts: Mapping[str, web.Application] | None = None
) -> web.Application:
    """The application: the management API under /api/v1 (its changes unless
    read-only); ``mounts``: sub-applications by path prefix, each guarding its own
    requests after the Host check, their responses given the dashboard's headers
    first; and unless serving the API alone, the pages always and the actions
    unless read-only."""
    app = web.Application(middlewares=[problems, _guard, _refusals], client_max_size=64 * 1024)
    app[DASHBOARD] = dashboard
    app.on_response_prepare.append(_headers)
    api = Api(
        store=dashboard.store,
        log=dashboard.log,
        keyring=dashboard.keyring,
        read_only=dashboard.read_only,
        body_timeout=dashboard.limits.body_timeout,
    )
    app.add_subapp(PREFIX, build_api(api))
    for prefix, mounted in (mounts or {}).items():
        app.add_subapp(prefix, mounted)
    if not dashboard.pages:
        return app
    app.router.add_get("/", views.overview)
    app.router.add_get("/login", views.login_page)
    app.router.add_post("/login", views.login)
    app.router.add_get("/messages", views.messages)
    app.router.add_get("/messages/{id}", views.message)
    app.router.add_get("/dead", dead_pages.dead)
    app.router.add_get("/endpoints", endpoint_pages.endpoints)
    if not dashboard.read_only:
        app.router.add_get("/endpoints/new", endpoint_forms.endpoint_new)
        app.router.add_post("/endpoints/new", endpoint_forms.endpoint_add)
    app.router.add_get("/endpoints/{id}", endpoint_pages.endpoint)
    app.router.add_get("/tenants", tenant_pages.tenants)
    app.router.add_get("/tenants/{tenant}", tenant_pages.tenant)
    app.router.add_static("/static/", views.STATIC, append_version=True)
    if not dashboard.read_only:
        app.router.add_post("/messages/{id}/reveal", views.message_reveal)
        app.router.add_post("/messages/{id}/retry", views.message_retry)
        app.router.add_post("/messages/{id}/replay", views.message_replay)
        app.router.add_post("/messages/{id}/cancel", views.cancel_message)
        app.router.add_get("/dead/confirm", dead_pages.dead_confirm)
        app.router.add_post("/dead/{action:retry|purge}", dead_pages.dead_act)
        app.router.add_post(
            "/endpoints/{id}/{action:enable|disable}", endpoint_pages.endpoint_toggle
        )
        app.router.add_post("/endpoints/{id}/edit", endpoint_forms.endpoint_edit)
        app.router.add_get("/endpoints/{id}/delete", endpoint_forms.endpoint_delete_confirm)
        app.router.add_post("/endpoints/{id}/delete", endpoint_forms.endpoint_delete)
        app.router.add_get("/endpoints/{id}/rotate-secret", endpoint_pages.endpoint_rotate_confirm)
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
    mounts: Mapping[str, web.Application] | None = None,
) -> None:
    """Serve until cancelled; ``started`` gets the URL once the socket listens and
    the day chart is read; ``mounts`` as :func:`build_app` takes them."""
    await asyncio.to_thread(dashboard.store.open)
    limits = dashboard.limits
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(_LoopErrors(dashboard.log, previous))
    # keepalive_timeout is the header deadline: aiohttp closes a connection that
    # has not sent a whole request this long after it opened or was last answered
    runner = web.AppRunner(
        build_app(dashboard, mounts=mounts),
        access_log=None,
        keepalive_timeout=limits.header_timeout,
    )
    try:
        await runner.setup()
        if runner.server is None:  # setup() made it
            raise RuntimeError("the dashboard's server was not set up")
        gate = _Gate(runner.server, cap=limits.max_connections, log=dashboard.log)
        site = _Site(runner, host, port, gate)
        try:
            await site.start()
        except OSError as exc:
            # aiohttp's own text repeats the address: the system's reason is enough
            reason = os.strerror(exc.errno) if exc.errno else exc.strerror
            raise CannotListen(f"cannot listen on {host} port {port}: {reason}") from exc
        bound = runner.addresses[0]
        url = f"http://{'[' + host + ']' if ':' in host else host}:{bound[1]}/"
        dashboard.log.event(
            "ui_listening", url=url, read_only=dashboard.read_only, pages=dashboard.pages
        )
        if dashboard.pages:
            await _warm(dashboard)
        if started is not None:
            started(url)
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        loop.set_exception_handler(previous)
        await asyncio.to_thread(dashboard.store.close)


class CannotListen(Exception):
    """The dashboard's address cannot be listened on: the port is taken, or the
    address is not this machine's."""


class _Throttled:
    """An event logged at most once per ``every`` seconds, with how many times it
    happened since it was last logged."""

    def __init__(self, log: EventLog, event: str, *, every: float = 60.0) -> None:
        self._log = log
        self._event = event
        self._every = every
        self._unlogged = 0
        self._logged_at: float | None = None

    def note(self, **fields: Any) -> None:
        self._unlogged += 1
        now = time.monotonic()
        if self._logged_at is not None and now - self._logged_at < self._every:
            return
        self._log.event(self._event, times=self._unlogged, **fields)
        self._unlogged, self._logged_at = 0, now


_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


class _Refused(asyncio.Protocol):
    """A connection past the cap: answered 503 and closed, nothing read."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(_BUSY)
        transport.close()


class _Gate:
    """The listening socket's protocol factory: aiohttp's server while it holds
    fewer than ``cap`` connections, else :class:`_Refused`.

    aiohttp counts a connection once it is made, a step after the factory is
    called; a burst of connections accepted together would all see the count
    before any is made. So those handed over since the loop last settled are
    counted too, until the connections they became are counted instead (two
    turns of the loop: one for their ``connection_made``, queued as each is
    accepted, one for this count's reset, queued behind them)."""

    def __init__(self, server: web.Server, *, cap: int, log: EventLog) -> None:
        self._server = server
        self._cap = cap
        self._handed = 0
        self._refusals = _Throttled(log, "ui_connections_refused")

    def __call__(self) -> asyncio.BaseProtocol:
        if len(self._server.connections) + self._handed >= self._cap:
            self._refusals.note(cap=self._cap)
            return _Refused()
        if self._handed == 0:
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._settle)
        self._handed += 1
        return self._server()

    def _settle(self) -> None:
        self._handed = 0


class _Site(web.BaseSite):
    """aiohttp's TCP site, listening with :class:`_Gate` as protocol factory."""

    __slots__ = ("_gate", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, gate: _Gate) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._gate = gate

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._gate, self._host, self._port, backlog=self._backlog, reuse_address=True
        )


_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


class _LoopErrors:
    """The event loop's exception handler while the dashboard serves: running out
    of file descriptors (the loop then pauses accepting, and retries) is logged
    at most once a minute, without a traceback; anything else goes to the
    handler that was there before."""

    def __init__(
        self,
        log: EventLog,
        previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None,
    ) -> None:
        self._previous = previous
        self._exhausted = _Throttled(log, "ui_out_of_file_descriptors")

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS:
            self._exhausted.note(error=exc.strerror)
        elif self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)


async def _warm(dashboard: Dashboard) -> None:
    """Read the day chart once while no page waits for it; if that fails, the
    first overview reads it instead (and says why, if it fails again)."""
    try:
        await dashboard.store.read(dashboard.store.warm)
    except Exception as exc:  # the pages still serve; the overview retries the read
        dashboard.log.event("ui_day_chart_unread", error=type(exc).__name__)
