"""Routes of messages, dead letters and replay.

A tenant's token sees the messages of its tenant's endpoints only: a message
without an endpoint (a plain enqueue), or whose endpoint was deleted, is the
operator's. Searching is by key, event type, endpoint, tenant, state and
creation time, newest first. Retrying and purging dead letters, and replaying,
go through :mod:`outbox.admin`; a tenant's selection of dead letters is first
narrowed to its own (at most :data:`~dispatchers.api.requests.MAX_IDS` a call),
and the ids it names that are not its own are answered as missing.
"""

from __future__ import annotations

from typing import Any

from dispatchers.api import cursors
from dispatchers.api.calls import Call, Route, library_errors, not_found
from dispatchers.api.endpoint_views import filtered_tenant, locked
from dispatchers.api.problems import invalid
from dispatchers.api.requests import (
    MAX_IDS,
    DeadQuery,
    DeadRetry,
    DeadSelection,
    IdPath,
    MessageQuery,
    MessageReplay,
    ReplayRequest,
)
from dispatchers.api.responses import (
    AttemptOut,
    DeadOut,
    DeadPage,
    DeadPurged,
    DeadRetried,
    MessageOut,
    MessagePage,
    MessageReplayed,
    MessageSummary,
    ReplayResult,
)
from dispatchers.api.store import Conn, audit
from dispatchers.store.web import attempts, messages
from outbox.internal import MAX_ID

_AFTER_LAST = MAX_ID
"""The ``before`` of a first page, newest first: above every id."""


async def _before(call: Call, cursor: str | None, kind: str) -> int:
    if cursor is None:
        return _AFTER_LAST
    try:
        return cursors.decode(kind, cursor, key=await call.cursor_key())
    except cursors.BadCursor as exc:
        raise invalid("query.cursor", str(exc)) from None


def _visible(conn: Conn, call: Call, message_id: int) -> None:
    """404 unless the token may see message ``message_id`` (an operator's sees
    every message; whether it exists is the caller's to find)."""
    if call.tenant_id is None:
        return
    if not messages.visible(conn, call.schema, message_id, tenant_id=call.tenant_id):
        raise not_found("message", message_id)


async def list_messages(call: Call) -> MessagePage:
    query = call.query(MessageQuery)
    before = await _before(call, query.cursor, "messages")

    def work(conn: Conn) -> list[messages.MessageSummary]:
        tenant_id = filtered_tenant(conn, call, query.tenant, "query.tenant")
        if tenant_id is False:
            return []
        return messages.search(
            conn,
            call.schema,
            tenant_id=tenant_id,
            **query.model_dump(exclude={"cursor", "limit", "tenant"}),
            before=before,
            limit=query.limit + 1,
        )

    found = await call.read(work)
    page = found[: query.limit]
    return MessagePage(
        items=[MessageSummary(**row._asdict()) for row in page],
        next_cursor=(
            cursors.encode("messages", page[-1].id, key=await call.cursor_key())
            if len(found) > query.limit
            else None
        ),
    )


async def show_message(call: Call) -> MessageOut:
    """The message in the token's scope, as the portal reads it; a tenant's
    token sees no attempt's owner (the store leaves it out)."""
    message_id = call.path(IdPath).id

    def work(conn: Conn) -> MessageOut:
        found = messages.get(conn, call.schema, message_id, tenant_id=call.tenant_id)
        if found is None:
            raise not_found("message", message_id)
        log = attempts.of_message(conn, call.schema, message_id, tenant_id=call.tenant_id)
        data = found._asdict()
        data["body_bytes"] = len(data.pop("body"))
        data["attempt_log"] = [AttemptOut(**a._asdict()) for a in log]
        return MessageOut(**data)

    return await call.read(work)


async def replay_one_message(call: Call) -> MessageReplayed:
    from outbox.admin import replay_message

    message_id = call.path(IdPath).id
    budget = call.body(MessageReplay).budget

    def work(conn: Conn) -> MessageReplayed:
        _visible(conn, call, message_id)
        with library_errors("path", message_id="path.id", endpoint_id="path.id"):
            replayed = replay_message(
                conn, schema=call.schema, message_id=message_id, budget=budget
            )
        audit(
            conn,
            call.schema,
            call.who,
            "replay",
            "message",
            message_id,
            detail={"replayed": replayed, "budget": budget},
        )
        return MessageReplayed(id=message_id, replayed=replayed)

    return await call.write(work)


async def list_dead(call: Call) -> DeadPage:
    query = call.query(DeadQuery)
    before = await _before(call, query.cursor, "dead")

    def work(conn: Conn) -> list[messages.Dead]:
        tenant_id = filtered_tenant(conn, call, query.tenant, "query.tenant")
        if tenant_id is False:
            return []
        return messages.dead_page(
            conn,
            call.schema,
            tenant_id=tenant_id,
            **query.model_dump(exclude={"cursor", "limit", "tenant"}),
            before=before,
            limit=query.limit + 1,
        )

    found = await call.read(work)
    page = [DeadOut(**row._asdict()) for row in found[: query.limit]]
    return DeadPage(
        items=page,
        next_cursor=(
            cursors.encode("dead", page[-1].id, key=await call.cursor_key())
            if len(found) > query.limit
            else None
        ),
    )


def _selection(selection: DeadSelection) -> dict[str, Any]:
    return {
        "ids": selection.ids,
        "endpoint_id": selection.endpoint_id,
        "event_type": selection.event_type,
        "since": selection.since,
        "all_": selection.all,
    }


def _tenants_dead(conn: Conn, call: Call, selection: DeadSelection) -> tuple[list[int], list[int]]:
    """A tenant's selection as the ids of its own dead messages (at most
    :data:`MAX_IDS`), and the ids it named that are not among them."""
    if selection.endpoint_id is not None:
        locked(conn, call, selection.endpoint_id)
    ids = messages.dead_ids(
        conn,
        call.schema,
        tenant_id=call.tenant_id,
        ids=selection.ids,
        endpoint_id=selection.endpoint_id,
        event_type=selection.event_type,
        since=selection.since,
        limit=MAX_IDS,
    )
    missing = sorted(set(selection.ids or ()) - set(ids))
    return ids, missing


def _audit_selection(selection: DeadSelection) -> dict[str, Any]:
    shown = selection.model_dump(mode="json", include={"endpoint_id", "event_type", "since", "all"})
    shown["ids"] = len(selection.ids or ())
    return shown


async def retry_dead(call: Call) -> DeadRetried:
    from outbox.admin import dead_missing, dead_retry

    body = call.body(DeadRetry)

    def work(conn: Conn) -> DeadRetried:
        with library_errors():
            if call.who.operator:
                missing = dead_missing(conn, body.ids or (), schema=call.schema)
                count = dead_retry(conn, schema=call.schema, budget=body.budget, **_selection(body))
            else:
                ids, missing = _tenants_dead(conn, call, body)
                count = (
                    dead_retry(conn, schema=call.schema, ids=ids, budget=body.budget) if ids else 0
                )
        detail = {"selection": _audit_selection(body), "retried": count}
        audit(conn, call.schema, call.who, "retry", "dead", detail=detail)
        return DeadRetried(retried=count, missing=missing)

    return await call.write(work)


async def purge_dead(call: Call) -> DeadPurged:
    from outbox.admin import dead_missing, dead_purge

    body = call.body(DeadSelection)

    def work(conn: Conn) -> DeadPurged:
        with library_errors():
            if call.who.operator:
                missing = dead_missing(conn, body.ids or (), schema=call.schema)
                count = dead_purge(conn, schema=call.schema, **_selection(body))
            else:
                ids, missing = _tenants_dead(conn, call, body)
                count = dead_purge(conn, schema=call.schema, ids=ids) if ids else 0
        detail = {"selection": _audit_selection(body), "purged": count}
        audit(conn, call.schema, call.who, "purge", "dead", detail=detail)
        return DeadPurged(purged=count, missing=missing)

    return await call.write(work)


async def replay(call: Call) -> ReplayResult:
    from outbox.admin import replay as replay_window
    from outbox.admin import replay_event

    body = call.body(ReplayRequest)

    def work(conn: Conn) -> ReplayResult:
        locked(conn, call, body.endpoint_id)
        with library_errors():
            if body.event_key is not None:
                sent = replay_event(
                    conn,
                    schema=call.schema,
                    event_key=body.event_key,
                    endpoint_id=body.endpoint_id,
                    budget=body.budget,
                )
                result = ReplayResult(
                    endpoint_id=body.endpoint_id,
                    replayed=None,
                    message_id=sent.id,
                    created=sent.created,
                )
            else:
                assert body.since is not None
                count = replay_window(
                    conn,
                    schema=call.schema,
                    endpoint_id=body.endpoint_id,
                    since=body.since,
                    until=body.until,
                    budget=body.budget,
                )
                result = ReplayResult(
                    endpoint_id=body.endpoint_id, replayed=count, message_id=None, created=None
                )
        audit(
            conn,
            call.schema,
            call.who,
            "replay",
            "endpoint",
            body.endpoint_id,
            detail=result.model_dump(mode="json", exclude={"endpoint_id"}),
        )
        return result

    return await call.write(work)


TAG_MESSAGES = "messages"
TAG_DEAD = "dead letters"

ROUTES = [
    Route("GET", "/messages", list_messages, MessagePage,
          "Search messages by key, event type, endpoint, tenant, state and time", TAG_MESSAGES,
          query_model=MessageQuery),
    Route("GET", "/messages/{id}", show_message, MessageOut,
          "Show a message and its attempts (header names, not values; no body)", TAG_MESSAGES,
          path_model=IdPath,
          note="A tenant's token sees no attempt's owner (null): its dispatcher's host and pid."),
    Route("POST", "/messages/{id}/replay", replay_one_message, MessageReplayed,
          "Send a delivered webhook message again", TAG_MESSAGES, path_model=IdPath,
          body_model=MessageReplay),
    Route("POST", "/replay", replay, ReplayResult,
          "Send an endpoint's delivered messages of a window again, or one recorded event",
          TAG_MESSAGES, body_model=ReplayRequest),
    Route("GET", "/dead", list_dead, DeadPage, "List dead messages, newest first", TAG_DEAD,
          query_model=DeadQuery),
    Route("POST", "/dead/retry", retry_dead, DeadRetried,
          "Send dead messages again with a fresh attempt budget", TAG_DEAD,
          body_model=DeadRetry),
    Route("POST", "/dead/purge", purge_dead, DeadPurged,
          "Delete dead messages and their attempts", TAG_DEAD, body_model=DeadSelection),
]  # fmt: skip
