"""The consumer portal as an aiohttp application, mounted by the dashboard under
``/portal/`` (:data:`outbox.portal.PATH_PREFIX`).

Every route starts with the link's token, ``/portal/<token>/...``. Before any
handler runs, :func:`_guard` looks the token up (as its digest) and answers 404
("this link has expired or was revoked") when it opens no link; a form posted
without the link's CSRF field is refused (403) and changes nothing. The token is
the credential: no session, no sign-in, after the dashboard's ``Host`` check.
Every response keeps the dashboard's headers, with the Content-Security-Policy's
frame-ancestors from ``--portal-frame-ancestors``, X-Frame-Options to match and
``Referrer-Policy: no-referrer`` (the token in an address is never sent to
another site). With ``--read-only``, the action routes are not added.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import psycopg
from aiohttp import web

from dispatchers.api.app import RETRY_AFTER
from dispatchers.portal import endpoint_views, views
from dispatchers.portal.guard import accepts_csrf, frame_options
from dispatchers.portal.pages import (
    EXPIRED,
    LINK,
    PORTAL,
    SEALED,
    TOKEN,
    UNREACHABLE,
    Portal,
    error,
    portal_of,
    render,
    templates,
)
from dispatchers.store.sqlstates import is_unreachable
from dispatchers.ui.dashboard import DASHBOARD, Dashboard, read_form
from outbox.errors import InvalidArgument
from outbox.portal import PATH_PREFIX, find_link, is_token
from outbox.sealing import SealBroken, SecretKeyMissing

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MOUNT = PATH_PREFIX.rstrip("/")
"""Where the dashboard mounts the portal's application (its routes add the rest
of :data:`~outbox.portal.PATH_PREFIX`)."""


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The token, then the CSRF field of a form, then the handler; what the
    handler could not do as a page saying why, and a database that cannot be
    reached (the token is looked up there) as a page saying so (503)."""
    try:
        return await _guarded(request, handler)
    except psycopg.Error as exc:
        if not is_unreachable(exc):
            raise
        response = error(request, 503, UNREACHABLE)
        response.headers["Retry-After"] = str(RETRY_AFTER)
        return response


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    refused = request.match_info.http_exception
    if refused is not None:  # no route: no page here, or an action in read-only mode
        return error(request, refused.status, "There is no such page here.")
    store = portal_of(request).dashboard.store
    token = request.match_info["token"]
    link = None
    if is_token(token):
        link = await store.read(lambda conn: find_link(conn, token, schema=store.schema))
    if link is None:
        return render(request, "expired.html", status=404, message=EXPIRED)
    request[LINK], request[TOKEN] = link, token
    if request.method == "POST":
        given = (await read_form(request)).get("csrf")
        if not accepts_csrf(token, given if isinstance(given, str) else None):
            return error(request, 403, "This form is not one of this page's: reload the page.")
    try:
        return await handler(request)
    except (SecretKeyMissing, SealBroken):
        return error(request, 409, SEALED.format(operator="the operator of this service"))
    except InvalidArgument as exc:  # what changed between the check and the change
        return error(request, 409, f"Nothing was changed: {exc.problem}.")
    except psycopg.errors.DataError as exc:
        portal_of(request).dashboard.log.event("portal_bad_value", sqlstate=exc.sqlstate)
        return error(request, 400, "A value of this request is one the database cannot take.")


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    """After the dashboard's headers: the portal's frame-ancestors, and never a
    Referer (the token is in every page's address)."""
    portal = request.app[PORTAL]
    response.headers["Content-Security-Policy"] = portal.csp
    options = frame_options(portal.ancestors)
    if options is None:
        response.headers.popall("X-Frame-Options", None)
    else:
        response.headers["X-Frame-Options"] = options
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"


def build_portal(
    dashboard: Dashboard, *, ancestors: tuple[str, ...] = ("'none'",)
) -> web.Application:
    """The portal's application, to mount at :data:`~outbox.portal.PATH_PREFIX`
    on the dashboard's (``ancestors``: checked by
    :func:`dispatchers.portal.guard.frame_ancestors`)."""
    app = web.Application(middlewares=[_guard])
    app[PORTAL] = Portal(dashboard, templates(), ancestors)
    app[DASHBOARD] = dashboard  # the dashboard's helpers (its form reader) serve here too
    app.on_response_prepare.append(_headers)
    add = app.router
    add.add_get("/{token}", views.to_home)
    add.add_get("/{token}/", views.home)
    add.add_get("/{token}/deliveries", views.deliveries)
    add.add_get("/{token}/deliveries/{id:[0-9]{1,19}}", views.message)
    if not dashboard.read_only:
        add.add_get("/{token}/endpoints/new", endpoint_views.endpoint_new)
        add.add_post("/{token}/endpoints/new", endpoint_views.endpoint_add)
    add.add_get("/{token}/endpoints/{id:[0-9]{1,19}}", endpoint_views.endpoint)
    if not dashboard.read_only:
        add.add_post("/{token}/deliveries/{id:[0-9]{1,19}}/replay", views.replay)
        add.add_post("/{token}/endpoints/{id:[0-9]{1,19}}/edit", endpoint_views.endpoint_edit)
        add.add_post(
            "/{token}/endpoints/{id:[0-9]{1,19}}/{action:enable|disable}",
            endpoint_views.endpoint_toggle,
        )
        add.add_post("/{token}/endpoints/{id:[0-9]{1,19}}/secret", endpoint_views.secret_reveal)
        add.add_get(
            "/{token}/endpoints/{id:[0-9]{1,19}}/rotate-secret", endpoint_views.rotate_confirm
        )
        add.add_post("/{token}/endpoints/{id:[0-9]{1,19}}/rotate-secret", endpoint_views.rotate)
        add.add_post("/{token}/endpoints/{id:[0-9]{1,19}}/test", endpoint_views.test_event)
        add.add_get("/{token}/endpoints/{id:[0-9]{1,19}}/delete", endpoint_views.delete_confirm)
        add.add_post("/{token}/endpoints/{id:[0-9]{1,19}}/delete", endpoint_views.delete)
    return app
