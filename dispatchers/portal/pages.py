"""What the portal's pages share: the portal, the link of the request, rendering,
and the log of what a portal's user did."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import Any

import jinja2
from aiohttp import web

from dispatchers.portal.guard import csrf_token, policy
from dispatchers.ui.app import CSP
from dispatchers.ui.dashboard import Dashboard
from outbox.portal import PATH_PREFIX, LinkHolder


@dataclass(frozen=True)
class Portal:
    """What the portal's handlers share: the dashboard (its connections, keys,
    log and bounds), the portal's templates, and which sites may frame it."""

    dashboard: Dashboard
    templates: jinja2.Environment
    ancestors: tuple[str, ...]

    @property
    def csp(self) -> str:
        return policy(CSP, self.ancestors)


PORTAL = web.AppKey("portal", Portal)
LINK = web.RequestKey("portal_link", LinkHolder)
"""The link the request's token opens, set by the guard."""
TOKEN = web.RequestKey("portal_token", str)

LISTED = 100
"""The most endpoints, and messages, one page lists."""

EXPIRED = "This link has expired or was revoked. Ask for a new one where you found it."

UNREACHABLE = (
    "This service cannot reach its database just now, so this page cannot be shown. "
    "Try again in a moment."
)


def templates() -> jinja2.Environment:
    """The portal's page templates, every value escaped unless marked safe."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dispatchers.portal", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.globals["utc"] = UTC
    return env


def portal_of(request: web.Request) -> Portal:
    return request.app[PORTAL]


def link_of(request: web.Request) -> LinkHolder:
    return request[LINK]


def render(request: web.Request, name: str, *, status: int = 200, **context: Any) -> web.Response:
    """Template ``name`` as an HTML response, with what every page shows: the
    tenant, the link's expiry, its base path and CSRF field (none on the page
    that refuses a link)."""
    portal = portal_of(request)
    token = request.get(TOKEN)
    text = portal.templates.get_template(name).render(
        link=request.get(LINK),
        base=f"{PATH_PREFIX}{token}/" if token else None,
        csrf=csrf_token(token) if token else "",
        read_only=portal.dashboard.read_only,
        **context,
    )
    return web.Response(text=text, status=status, content_type="text/html")


def error(request: web.Request, status: int, message: str) -> web.Response:
    return render(request, "error.html", status=status, message=message)


SEALED = (
    "The signing secret of this endpoint is sealed under a key this server was not "
    "given, so it cannot be shown or changed here. Ask {operator} to configure the key."
)


def log_action(request: web.Request, action: str, rows: int, **fields: Any) -> None:
    """Log an action of a portal's user: which tenant, by which link (its id,
    never its token), what, on how many rows."""
    link = link_of(request)
    portal_of(request).dashboard.log.event(
        "portal_action", tenant=link.tenant, link=link.id, action=action, rows=rows, **fields
    )
