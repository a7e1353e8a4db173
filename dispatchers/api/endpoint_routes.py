"""Routes of webhook endpoints: list, create, show, update, delete, disable,
enable, rotate the signing secret, send a test event.

Every change goes through :class:`outbox.Endpoints` (or :mod:`outbox.admin`),
in one transaction that first takes the endpoint's row lock, if the token may
see it (a tenant's token sees its tenant's endpoints only; any other is
answered 404, as one that does not exist), and ends with the audit entry. An
endpoint is shown without credentials or TLS material, its signing secrets by
their fingerprints; the secret itself is answered only by the routes that make
one (create, rotate-secret).

A tenant's token may set no payload filter (:data:`OPERATORS_FIELDS`): SQL's
``publish`` refuses an event that a filtered endpoint subscribes to, so a
tenant's filter would fail its producer's transactions.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dispatchers.api import cursors
from dispatchers.api.calls import Call, Route, changes_of, library_errors
from dispatchers.api.endpoint_views import (
    filtered_tenant,
    locked,
    refuse_plain_secret,
    shown,
    view,
)
from dispatchers.api.problems import Problem, invalid
from dispatchers.api.requests import (
    EndpointCreate,
    EndpointDisable,
    EndpointQuery,
    EndpointUpdate,
    IdPath,
    SecretRotate,
)
from dispatchers.api.responses import (
    EndpointCreated,
    EndpointDeleted,
    EndpointDisabled,
    EndpointEnabled,
    EndpointOut,
    EndpointPage,
    SecretRotated,
    TestSent,
)
from dispatchers.api.store import Conn, audit
from dispatchers.store.web import endpoints
from dispatchers.store.web.endpoints import Endpoint

TAG = "endpoints"

OPERATORS_FIELDS = frozenset({"filter"})
"""The fields of an endpoint's body that a tenant's token may not give (403)."""


def _operators_fields(call: Call, body: EndpointCreate | EndpointUpdate) -> None:
    """Refuse a tenant's token a field of :data:`OPERATORS_FIELDS`, given
    even as null: no action of a tenant may make a producer's publish fail."""
    if call.who.operator:
        return
    for name in sorted(body.model_fields_set & OPERATORS_FIELDS):
        field = f"body.{name}"
        raise Problem(
            403,
            f"{field}: an operator's setting; a tenant's token cannot set it "
            "(SQL's publish refuses events that a filtered endpoint subscribes to)",
            field=field,
        )


def _dump(endpoint: EndpointOut) -> dict[str, Any]:
    return endpoint.model_dump(mode="json")


async def list_endpoints(call: Call) -> EndpointPage:
    query = call.query(EndpointQuery)
    after = await _cursor(call, query.cursor, "endpoints")

    def work(conn: Conn) -> list[Endpoint]:
        tenant_id = filtered_tenant(conn, call, query.tenant, "query.tenant")
        if tenant_id is False:
            return []
        return endpoints.page(
            conn,
            call.schema,
            tenant_id=tenant_id,
            after=after,
            enabled=query.enabled,
            limit=query.limit + 1,
        )

    found = await call.read(work)
    page = found[: query.limit]
    more = len(found) > query.limit
    return EndpointPage(
        items=[shown(row, call.api.keyring) for row in page],
        next_cursor=(
            cursors.encode("endpoints", page[-1].id, key=await call.cursor_key()) if more else None
        ),
    )


async def _cursor(call: Call, cursor: str | None, kind: str, start: int = 0) -> int:
    if cursor is None:
        return start
    try:
        return cursors.decode(kind, cursor, key=await call.cursor_key())
    except cursors.BadCursor as exc:
        raise invalid("query.cursor", str(exc)) from None


async def create_endpoint(call: Call) -> EndpointCreated:
    body = call.body(EndpointCreate)
    _operators_fields(call, body)
    if not call.who.operator and body.tenant not in (None, call.who.tenant):
        raise Problem(
            403, "body.tenant: a tenant's token adds its own endpoints", field="body.tenant"
        )
    settings = body.model_dump(exclude={"tenant", "secret"}, exclude_none=True)
    tenant = body.tenant if call.who.operator else call.who.tenant

    def work(conn: Conn) -> EndpointCreated:
        refuse_plain_secret(conn, call)
        with library_errors():
            added = call.api.endpoints().add(conn, secret=body.secret, tenant=tenant, **settings)
        shown = view(conn, call, added.id)
        audit(conn, call.schema, call.who, "create", "endpoint", added.id, after=_dump(shown))
        return EndpointCreated(**shown.model_dump(), secret=added.secrets[0].secret)

    return await call.write(work)


async def show_endpoint(call: Call) -> EndpointOut:
    endpoint_id = call.path(IdPath).id
    return await call.read(lambda conn: view(conn, call, endpoint_id))


async def update_endpoint(call: Call) -> EndpointOut:
    endpoint_id = call.path(IdPath).id
    body = call.body(EndpointUpdate)
    _operators_fields(call, body)
    changes = changes_of(body)

    def work(conn: Conn) -> EndpointOut:
        before = locked(conn, call, endpoint_id)
        with library_errors():
            call.api.endpoints().update(conn, endpoint_id, **changes)
        after = view(conn, call, endpoint_id)
        audit(
            conn,
            call.schema,
            call.who,
            "update",
            "endpoint",
            endpoint_id,
            before=_dump(before),
            after=_dump(after),
            detail={"fields": sorted(body.model_fields_set)},
        )
        return after

    return await call.write(work)


async def delete_endpoint(call: Call) -> EndpointDeleted:
    endpoint_id = call.path(IdPath).id

    def work(conn: Conn) -> EndpointDeleted:
        before = locked(conn, call, endpoint_id)
        had = call.api.endpoints().delete(conn, endpoint_id)
        audit(
            conn,
            call.schema,
            call.who,
            "delete",
            "endpoint",
            endpoint_id,
            before=_dump(before),
            detail={"messages": had},
        )
        return EndpointDeleted(id=endpoint_id, messages=had)

    return await call.write(work)


async def disable_endpoint(call: Call) -> EndpointDisabled:
    endpoint_id = call.path(IdPath).id
    reason = call.body(EndpointDisable).reason

    def work(conn: Conn) -> EndpointDisabled:
        before = locked(conn, call, endpoint_id)
        with library_errors():
            paused = call.api.endpoints().disable(conn, endpoint_id, reason=reason)
        after = view(conn, call, endpoint_id)
        audit(
            conn,
            call.schema,
            call.who,
            "disable",
            "endpoint",
            endpoint_id,
            before=_dump(before),
            after=_dump(after),
            detail={"paused": paused},
        )
        return EndpointDisabled(endpoint=after, paused=paused)

    return await call.write(work)


async def enable_endpoint(call: Call) -> EndpointEnabled:
    endpoint_id = call.path(IdPath).id

    def work(conn: Conn) -> EndpointEnabled:
        before = locked(conn, call, endpoint_id)
        resumed = call.api.endpoints().enable(conn, endpoint_id)
        after = view(conn, call, endpoint_id)
        audit(
            conn,
            call.schema,
            call.who,
            "enable",
            "endpoint",
            endpoint_id,
            before=_dump(before),
            after=_dump(after),
            detail={"resumed": resumed},
        )
        return EndpointEnabled(endpoint=after, resumed=resumed)

    return await call.write(work)


async def rotate_endpoint_secret(call: Call) -> SecretRotated:
    endpoint_id = call.path(IdPath).id
    body = call.body(SecretRotate)
    overlap = timedelta(hours=body.overlap_hours)

    def work(conn: Conn) -> SecretRotated:
        before = locked(conn, call, endpoint_id)
        refuse_plain_secret(conn, call)
        with library_errors():
            rotated = call.api.endpoints().rotate_secret(
                conn, endpoint_id, secret=body.secret, overlap=overlap
            )
        after = view(conn, call, endpoint_id)
        audit(
            conn,
            call.schema,
            call.who,
            "rotate-secret",
            "endpoint",
            endpoint_id,
            before=_dump(before),
            after=_dump(after),
        )
        expiring = [s.expires_at for s in rotated.secrets[1:] if s.expires_at is not None]
        return SecretRotated(
            id=endpoint_id,
            secret=rotated.secrets[0].secret,
            previous_secrets_expire_at=max(expiring, default=None),
        )

    return await call.write(work)


async def test_endpoint(call: Call) -> TestSent:
    from outbox.admin import send_test_event

    endpoint_id = call.path(IdPath).id

    def work(conn: Conn) -> TestSent:
        locked(conn, call, endpoint_id)
        with library_errors("path", endpoint_id="path.id"):
            message_id = send_test_event(conn, schema=call.schema, endpoint_id=endpoint_id)
        audit(
            conn,
            call.schema,
            call.who,
            "test",
            "endpoint",
            endpoint_id,
            detail={"message_id": message_id},
        )
        return TestSent(endpoint_id=endpoint_id, message_id=message_id)

    return await call.write(work)


_TENANT_NOTE = (
    f"A tenant's token may not give {', '.join(sorted(OPERATORS_FIELDS))} (403 naming it): "
    "SQL's publish refuses an event that an endpoint with a payload filter subscribes to."
)

ROUTES = [
    Route("GET", "/endpoints", list_endpoints, EndpointPage, "List endpoints", TAG,
          query_model=EndpointQuery),
    Route("POST", "/endpoints", create_endpoint, EndpointCreated,
          "Create an endpoint (answers its signing secret, once)", TAG, status=201,
          body_model=EndpointCreate, note=_TENANT_NOTE),
    Route("GET", "/endpoints/{id}", show_endpoint, EndpointOut, "Show an endpoint", TAG,
          path_model=IdPath),
    Route("PATCH", "/endpoints/{id}", update_endpoint, EndpointOut,
          "Change an endpoint's settings (null clears a setting that may be cleared)", TAG,
          path_model=IdPath, body_model=EndpointUpdate, note=_TENANT_NOTE),
    Route("DELETE", "/endpoints/{id}", delete_endpoint, EndpointDeleted,
          "Delete an endpoint (its waiting messages die)", TAG, path_model=IdPath),
    Route("POST", "/endpoints/{id}/disable", disable_endpoint, EndpointDisabled,
          "Disable an endpoint (its waiting messages pause)", TAG, path_model=IdPath,
          body_model=EndpointDisable),
    Route("POST", "/endpoints/{id}/enable", enable_endpoint, EndpointEnabled,
          "Enable an endpoint (its paused messages resume)", TAG, path_model=IdPath),
    Route("POST", "/endpoints/{id}/rotate-secret", rotate_endpoint_secret, SecretRotated,
          "Sign with a new secret (answered once); the old ones sign during the overlap",
          TAG, path_model=IdPath, body_model=SecretRotate),
    Route("POST", "/endpoints/{id}/test", test_endpoint, TestSent,
          "Send the endpoint a signed test event", TAG, path_model=IdPath),
]  # fmt: skip
