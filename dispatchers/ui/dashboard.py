"""What every request of the dashboard shares, and how a page is rendered."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC
from typing import Any

import jinja2
from aiohttp import web
from multidict import MultiMapping

from dispatchers.runtime.log import EventLog
from dispatchers.ui.auth import COOKIE, Guard
from dispatchers.ui.limits import Limits
from dispatchers.ui.store import DashboardStore
from outbox.endpoints import Endpoints
from outbox.sealing import Keyring


@dataclass(frozen=True)
class Dashboard:
    """What the handlers share: the database, the guard, the templates, the log."""

    store: DashboardStore
    guard: Guard
    log: EventLog
    templates: jinja2.Environment
    read_only: bool
    database: str
    """The database as the header shows it: name and host, never credentials."""
    keyring: Keyring | None = None
    """The keys that open sealed signing secrets; without the one a secret is
    sealed under, its fingerprint shows as unavailable and changes that need it
    are refused, saying so."""
    limits: Limits = field(default_factory=Limits)
    pages: bool = True
    """Whether the pages are served beside the management API (``--api-only``:
    the API alone)."""

    def endpoints(self) -> Endpoints:
        """The library's endpoints of the dashboard's schema, with its keyring."""
        return Endpoints(schema=self.store.schema, keyring=self.keyring)


DASHBOARD = web.AppKey("dashboard", Dashboard)

SESSION = web.RequestKey("session", str)
"""The id of the request's session, set by the guard."""


def templates() -> jinja2.Environment:
    """The page templates, every value escaped unless marked safe."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dispatchers.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals["utc"] = UTC
    return env


def render(request: web.Request, name: str, *, status: int = 200, **context: Any) -> web.Response:
    """Template ``name`` as an HTML response, with what the layout shows on every
    page: the database, the schema, the read-only badge, the session's CSRF token."""
    dashboard = request.app[DASHBOARD]
    sid = request.get(SESSION)
    text = dashboard.templates.get_template(name).render(
        database=dashboard.database,
        schema=dashboard.store.schema,
        read_only=dashboard.read_only,
        csrf=dashboard.guard.csrf_token(sid) if sid else "",
        path=request.path,
        **context,
    )
    return web.Response(text=text, status=status, content_type="text/html")


def dashboard_of(request: web.Request) -> Dashboard:
    return request.app[DASHBOARD]


async def read_form(request: web.Request) -> MultiMapping[Any]:
    """The request's form, read within the body timeout (else 408)."""
    try:
        async with asyncio.timeout(dashboard_of(request).limits.body_timeout):
            return await request.post()
    except TimeoutError:
        raise web.HTTPRequestTimeout(text="the form did not arrive in time") from None


def bad(request: web.Request, problem: ValueError) -> web.Response:
    """The 400 page for a field that cannot be meant, saying which."""
    return render(request, "error.html", status=400, message=str(problem))


def log_action(dashboard: Dashboard, action: str, rows: int, **fields: Any) -> None:
    """Log an action: who (the token's id, or ``local``), what, on how many rows."""
    dashboard.log.event(
        "ui_action", who=dashboard.guard.principal, action=action, rows=rows, **fields
    )


def set_session(response: web.StreamResponse, value: str) -> None:
    """Set the session cookie: not readable by scripts, never sent cross-site."""
    response.set_cookie(COOKIE, value, httponly=True, samesite="Strict", path="/")
