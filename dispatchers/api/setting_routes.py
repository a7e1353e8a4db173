"""Routes of what is the operator's alone: event types' retry schedules,
destination policies (of plain destinations, which no tenant owns), the status
snapshot and the audit log; and the route every token may use to see itself.
"""

from __future__ import annotations

from dispatchers.api import cursors
from dispatchers.api.calls import Call, Route, library_errors, not_found
from dispatchers.api.problems import invalid
from dispatchers.api.requests import (
    DestinationQuery,
    DestinationSet,
    EventTypePath,
    EventTypeSet,
    PageQuery,
)
from dispatchers.api.responses import (
    AuditOut,
    AuditPage,
    DestinationDeleted,
    DestinationList,
    DestinationOut,
    EventTypeDeleted,
    EventTypeList,
    EventTypeOut,
    StatusOut,
    TokenOut,
)
from dispatchers.api.store import Conn, audit
from dispatchers.store.web import tokens
from outbox.destinations import Destinations
from outbox.event_types import EventTypes
from outbox.internal import MAX_ID


async def show_token(call: Call) -> TokenOut:
    who = call.who
    return TokenOut(id=who.token_id, name=who.name, scope=who.scope, tenant=who.tenant)


async def status(call: Call) -> StatusOut:
    from outbox.admin import status as snapshot

    return StatusOut.model_validate(
        await call.read(lambda conn: snapshot(conn, schema=call.schema))
    )


async def list_audit(call: Call) -> AuditPage:
    query = call.query(PageQuery)
    before = MAX_ID
    if query.cursor is not None:
        try:
            before = cursors.decode("audit", query.cursor, key=await call.cursor_key())
        except cursors.BadCursor as exc:
            raise invalid("query.cursor", str(exc)) from None
    found = await call.read(
        lambda conn: tokens.audit_page(conn, call.schema, before=before, limit=query.limit + 1)
    )
    page = [AuditOut(**entry._asdict()) for entry in found[: query.limit]]
    more = len(found) > query.limit
    return AuditPage(
        items=page,
        next_cursor=(
            cursors.encode("audit", page[-1].id, key=await call.cursor_key()) if more else None
        ),
    )


# -- event types -------------------------------------------------------------------


async def list_event_types(call: Call) -> EventTypeList:
    found = await call.read(EventTypes(schema=call.schema).all)
    return EventTypeList(items=[EventTypeOut(**t.as_dict()) for t in found])


async def show_event_type(call: Call) -> EventTypeOut:
    name = call.path(EventTypePath).event_type
    found = await call.read(lambda conn: EventTypes(schema=call.schema).get(conn, name))
    if found is None:
        raise not_found("settings for event type", repr(name))
    return EventTypeOut(**found.as_dict())


async def set_event_type(call: Call) -> EventTypeOut:
    name = call.path(EventTypePath).event_type
    schedule = call.body(EventTypeSet).retry_schedule
    event_types = EventTypes(schema=call.schema)

    def work(conn: Conn) -> EventTypeOut:
        before = event_types.get(conn, name)
        with library_errors(event_type="path.event_type"):
            after = EventTypeOut(**event_types.set(conn, name, retry_schedule=schedule).as_dict())
        audit(
            conn,
            call.schema,
            call.who,
            "set",
            "event_type",
            name,
            before=None
            if before is None
            else EventTypeOut(**before.as_dict()).model_dump(mode="json"),
            after=after.model_dump(mode="json"),
        )
        return after

    return await call.write(work)


async def delete_event_type(call: Call) -> EventTypeDeleted:
    name = call.path(EventTypePath).event_type
    event_types = EventTypes(schema=call.schema)

    def work(conn: Conn) -> EventTypeDeleted:
        before = event_types.get(conn, name)
        if before is None:
            raise not_found("settings for event type", repr(name))
        event_types.delete(conn, name)
        shown = EventTypeOut(**before.as_dict()).model_dump(mode="json")
        audit(conn, call.schema, call.who, "delete", "event_type", name, before=shown)
        return EventTypeDeleted(event_type=name)

    return await call.write(work)


# -- destination policies ----------------------------------------------------------


async def list_destinations(call: Call) -> DestinationList:
    found = await call.read(Destinations(schema=call.schema).all)
    return DestinationList(items=[DestinationOut(**p.as_dict()) for p in found])


async def set_destination(call: Call) -> DestinationOut:
    body = call.body(DestinationSet)
    destinations = Destinations(schema=call.schema)

    def work(conn: Conn) -> DestinationOut:
        with library_errors():
            before = destinations.get(conn, body.destination)
            policy = destinations.set(
                conn,
                body.destination,
                rate_limit=body.rate_limit,
                burst=body.burst,
                max_concurrency=body.max_concurrency,
            )
        after = DestinationOut(**policy.as_dict())
        audit(
            conn,
            call.schema,
            call.who,
            "set",
            "destination",
            policy.destination,
            before=None
            if before is None
            else DestinationOut(**before.as_dict()).model_dump(mode="json"),
            after=after.model_dump(mode="json"),
        )
        return after

    return await call.write(work)


async def delete_destination(call: Call) -> DestinationDeleted:
    given = call.query(DestinationQuery).destination
    destinations = Destinations(schema=call.schema)

    def work(conn: Conn) -> DestinationDeleted:
        with library_errors("query"):
            before = destinations.get(conn, given)
        if before is None:
            raise not_found("policy for destination", given)
        destinations.delete(conn, given)
        shown = DestinationOut(**before.as_dict()).model_dump(mode="json")
        audit(
            conn, call.schema, call.who, "delete", "destination", before.destination, before=shown
        )
        return DestinationDeleted(destination=before.destination)

    return await call.write(work)


_EVENT_TYPE = "/event-types/{event_type:.+}"
"""aiohttp's pattern of an event type's path: event types may hold '/'."""

ROUTES = [
    Route("GET", "/token", show_token, TokenOut, "Show the token this request is made with",
          "tokens"),
    Route("GET", "/status", status, StatusOut,
          "The outbox's status: backlog, lag, endpoints, destinations", "status",
          operator_only=True),
    Route("GET", "/audit", list_audit, AuditPage, "The audit log of writes, newest first",
          "audit", query_model=PageQuery, operator_only=True),
    Route("GET", "/event-types", list_event_types, EventTypeList,
          "List event types with settings", "event types", operator_only=True),
    Route("GET", "/event-types/{event_type}", show_event_type, EventTypeOut,
          "Show an event type's settings", "event types", path_model=EventTypePath,
          operator_only=True, pattern=_EVENT_TYPE),
    Route("PUT", "/event-types/{event_type}", set_event_type, EventTypeOut,
          "Set an event type's retry schedule", "event types", path_model=EventTypePath,
          body_model=EventTypeSet, operator_only=True, pattern=_EVENT_TYPE),
    Route("DELETE", "/event-types/{event_type}", delete_event_type, EventTypeDeleted,
          "Drop an event type's settings", "event types", path_model=EventTypePath,
          operator_only=True, pattern=_EVENT_TYPE),
    Route("GET", "/destinations", list_destinations, DestinationList,
          "List the policies of plain destinations", "destinations", operator_only=True),
    Route("PUT", "/destinations", set_destination, DestinationOut,
          "Set a plain destination's policy (a URL names its origin)", "destinations",
          body_model=DestinationSet, operator_only=True),
    Route("DELETE", "/destinations", delete_destination, DestinationDeleted,
          "Remove a plain destination's policy", "destinations",
          query_model=DestinationQuery, operator_only=True),
]  # fmt: skip
