"""The portal's pages of deliveries: the home page (the tenant's endpoints and
latest deliveries), the deliveries, one message with its attempts, and its
replay. Each page reads in one read-only transaction, through the functions an
API token of the tenant reads with (:mod:`dispatchers.store.web`, scoped to the
tenant): a message of another tenant is "no such message", as a missing one is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from dispatchers.portal.pages import LISTED, error, link_of, log_action, portal_of, render
from dispatchers.store.web import attempts as web_attempts
from dispatchers.store.web import endpoints as web_endpoints
from dispatchers.store.web import messages as web_messages
from dispatchers.store.web.attempts import Attempt
from dispatchers.store.web.endpoints import Listed, shown_secrets
from dispatchers.store.web.messages import Message, MessageSummary
from dispatchers.ui.fields import BadInput, read_id, route_id
from outbox.admin import replay_message
from outbox.errors import InvalidArgument
from outbox.portal import PATH_PREFIX

HOME_DELIVERIES = 10
"""The latest deliveries the home page lists (the deliveries page lists more)."""

SHOWN_BODY = 64 * 1024
"""The most bytes of a message's body its page shows."""

NO_MESSAGE = "There is no such message here (it was never sent to your endpoints, or was purged)."


async def to_home(request: web.Request) -> web.StreamResponse:
    """A link without its final slash: the home page."""
    raise web.HTTPSeeOther(f"{PATH_PREFIX}{request.match_info['token']}/")


async def home(request: web.Request) -> web.StreamResponse:
    """The tenant's endpoints and its latest deliveries."""
    portal, link = portal_of(request), link_of(request)
    schema = portal.dashboard.store.schema

    def read(conn: Any) -> tuple[list[Listed], list[MessageSummary]]:
        page = web_endpoints.page(conn, schema, tenant_id=link.tenant_id, limit=LISTED)
        latest = web_messages.deliveries(conn, schema, tenant_id=link.tenant_id, limit=LISTED)
        return (
            web_endpoints.listed(conn, schema, page, tenant_id=link.tenant_id),
            latest[:HOME_DELIVERIES],
        )

    endpoints, latest = await portal.dashboard.store.read(read)
    keyring = portal.dashboard.keyring
    return render(
        request,
        "home.html",
        endpoints=endpoints,
        secrets={e.id: shown_secrets(e.secrets, e.id, keyring) for e in endpoints},
        deliveries=latest,
        listed=LISTED,
        notice=_deleted_notice(request.query),
    )


def _deleted_notice(fields: Mapping[str, str]) -> str | None:
    """What the home page says after an endpoint was deleted."""
    endpoint_id, count = fields.get("deleted", ""), fields.get("count", "")
    if not all(v.isascii() and v.isdigit() and len(v) < 20 for v in (endpoint_id, count)):
        return None
    return (
        f"Deleted endpoint {int(endpoint_id)}; its {int(count)} message(s) not yet "
        "delivered will not be sent."
    )


async def deliveries(request: web.Request) -> web.StreamResponse:
    """The tenant's newest messages, of one of its endpoints with ``endpoint``."""
    portal, link = portal_of(request), link_of(request)
    schema = portal.dashboard.store.schema
    try:
        endpoint_id = read_id(request.query, "endpoint")
    except BadInput as exc:
        return error(request, 400, str(exc))
    rows = await portal.dashboard.store.read(
        lambda conn: web_messages.deliveries(
            conn, schema, tenant_id=link.tenant_id, endpoint_id=endpoint_id, limit=LISTED
        )
    )
    return render(
        request, "deliveries.html", deliveries=rows, endpoint_id=endpoint_id, listed=LISTED
    )


async def message(request: web.Request) -> web.StreamResponse:
    """One message of the tenant: where it goes, its state, its body and every
    attempt with the receiver's status and the start of its reply."""
    portal, link = portal_of(request), link_of(request)
    schema = portal.dashboard.store.schema
    try:
        message_id = route_id(request)
    except BadInput as exc:
        return error(request, 400, str(exc))

    def read(conn: Any) -> tuple[Message | None, list[Attempt]]:
        found = web_messages.get(conn, schema, message_id, tenant_id=link.tenant_id)
        if found is None:
            return None, []
        return found, web_attempts.of_message(conn, schema, message_id, tenant_id=link.tenant_id)

    found, attempts = await portal.dashboard.store.read(read)
    if found is None:
        return error(request, 404, NO_MESSAGE)
    body = found.body[:SHOWN_BODY]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = "(binary) " + body.hex()
    return render(
        request,
        "message.html",
        message=found,
        attempts=attempts,
        body=text,
        cut=len(found.body) > SHOWN_BODY,
        notice=_replay_notice(request.query),
    )


def _replay_notice(fields: Mapping[str, str]) -> str | None:
    if fields.get("done") != "replay":
        return None
    if fields.get("count") == "1":
        return "Replayed: it will be sent again shortly, with the same webhook-id."
    if fields.get("count") == "0":
        return "It was not delivered yet: nothing was sent again."
    return None


async def replay(request: web.Request) -> web.StreamResponse:
    """Send a delivered message of the tenant again, with the same ``webhook-id``
    (:func:`outbox.admin.replay_message`)."""
    portal, link = portal_of(request), link_of(request)
    schema = portal.dashboard.store.schema
    try:
        message_id = route_id(request)
    except BadInput as exc:
        return error(request, 400, str(exc))

    def act(conn: Any) -> bool | None:
        if web_messages.get(conn, schema, message_id, tenant_id=link.tenant_id) is None:
            return None
        return replay_message(conn, schema=schema, message_id=message_id)

    try:
        replayed = await portal.dashboard.store.write(act)
    except InvalidArgument as exc:
        return error(request, 409, f"Not replayed: {exc.problem}.")
    if replayed is None:
        return error(request, 404, NO_MESSAGE)
    log_action(request, "replay_message", int(replayed), message_id=message_id)
    base = f"{PATH_PREFIX}{request.match_info['token']}/"
    raise web.HTTPSeeOther(f"{base}deliveries/{message_id}?done=replay&count={int(replayed)}")
