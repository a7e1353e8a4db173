"""The application-facing API: write outbox messages inside your own transaction."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, NamedTuple

from outbox._digest import event_digest
from outbox._endpoint_fields import check_published_type, check_tenant_id
from outbox._filters import Verdicts
from outbox._message import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_ATTEMPTS_LIMIT,
    build_message,
    check_optional_key,
    encode_body,
)
from outbox._queries import Queries, queries_for
from outbox._storable import check_json
from outbox._tracing import current_trace_context
from outbox._transaction import Plan, run_async, run_sync, scalar, schema_required
from outbox.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_SCHEMA, DEFAULT_WEBHOOK_MAX_ATTEMPTS
from outbox.errors import ConfigurationError, IdempotencyKeyReused, InvalidMessage, OutboxError

MAX_EVENT_KEY = 200  # the endpoint id is appended to make each message's key
PUBLISH_ROUNDS = 4
"""How many times ``publish`` reads the subscribed endpoints' filters before it
gives up: once to learn them, once more per change made to them meanwhile."""


class _Existing(NamedTuple):
    """The message that holds a key, and the digest of its request (None for a
    key written before digests were kept: it accepts any request)."""

    id: int
    digest: bytes | None


class _Event(NamedTuple):
    """An event published before: the ids its publish returned, and its digest."""

    message_ids: list[int]
    digest: bytes


class _Published(NamedTuple):
    """The row of ``publish``: the ids it wrote (``created_ids``), or the event
    that held the key already (``existing_ids`` and ``digest``), or neither when a
    concurrent transaction committed the event while this one waited for it,
    when subscribed endpoints have filters not judged yet (``unevaluated``), or
    when the tenant named is not one of this outbox's (``tenant_known`` false)."""

    created_ids: list[int] | None
    existing_ids: list[int] | None
    digest: bytes | None
    unevaluated: list[str]
    tenant_known: bool
    notified: None = None


def _attempt_budget(name: str, value: object) -> int:
    """A setting's attempt budget, or :class:`ConfigurationError` naming it (a setting
    is not a message: :func:`check_max_attempts` is the message's own check)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name}: must be an integer, not {type(value).__name__}")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ConfigurationError(f"{name}: must be between 1 and {MAX_ATTEMPTS_LIMIT}")
    return value


class Outbox:
    """Settings for writing outbox messages. Holds no connection.

    :param schema: the PostgreSQL schema of the outbox tables.
    :param notify: wake the dispatcher on duty when the transaction commits, if it
        is waiting idle for work (one ``NOTIFY`` per transaction, folded by
        PostgreSQL; while dispatchers are busy, or none listens, nothing is sent
        and the check costs one shared advisory lock). Off, dispatchers find the
        message when they next poll.
    :param max_body_bytes: the largest body ``enqueue`` accepts.
    :param max_attempts: the attempt budget of a message that does not give one.
    :param webhook_max_attempts: the attempt budget of each published webhook.
    """

    def __init__(
        self,
        *,
        schema: str = DEFAULT_SCHEMA,
        notify: bool = True,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        webhook_max_attempts: int = DEFAULT_WEBHOOK_MAX_ATTEMPTS,
    ) -> None:
        self.queries: Queries = queries_for(schema)
        if (
            isinstance(max_body_bytes, bool)
            or not isinstance(max_body_bytes, int)
            or (max_body_bytes < 1)
        ):
            raise ConfigurationError("max_body_bytes: must be a positive integer")
        self.max_attempts = _attempt_budget("max_attempts", max_attempts)
        self.webhook_max_attempts = _attempt_budget("webhook_max_attempts", webhook_max_attempts)
        self.schema = schema
        self.notify = bool(notify)
        self.max_body_bytes = max_body_bytes

    def __repr__(self) -> str:
        return f"Outbox(schema={self.schema!r}, notify={self.notify})"

    def enqueue(
        self,
        tx: Any,
        *,
        url: str,
        idempotency_key: str,
        json: Any = None,
        body: bytes | str | None = None,
        content_type: str | None = None,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        ordering_key: str | None = None,
        available_at: datetime | None = None,
        max_attempts: int | None = None,
    ) -> int:
        """Write one HTTP request to be made once ``tx`` commits; return its message id.

        ``tx`` is a SQLAlchemy ``Session`` or ``Connection``, a psycopg
        ``Connection``, or a Django connection (in ``transaction.atomic()``);
        the row is written in its open transaction, which this method never
        commits. Enqueuing the same ``idempotency_key`` for the same ``url``
        again returns the first message's id and writes nothing if it asks for
        the same request (method, headers, content type, body: see
        ``outbox._digest``), and raises :class:`outbox.IdempotencyKeyReused`,
        naming that message, if it does not.
        Give exactly one of ``json`` (serialised compactly, ``application/json``)
        or ``body`` (bytes, or str sent as UTF-8). Raises
        :class:`outbox.InvalidMessage`, naming the field, for bad input.
        """
        plan = self._enqueue_plan(
            url=url,
            idempotency_key=idempotency_key,
            json=json,
            body=body,
            content_type=content_type,
            method=method,
            headers=headers,
            ordering_key=ordering_key,
            available_at=available_at,
            max_attempts=max_attempts,
        )
        with schema_required(self.schema):
            return run_sync(tx, plan)

    async def enqueue_async(
        self,
        tx: Any,
        *,
        url: str,
        idempotency_key: str,
        json: Any = None,
        body: bytes | str | None = None,
        content_type: str | None = None,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        ordering_key: str | None = None,
        available_at: datetime | None = None,
        max_attempts: int | None = None,
    ) -> int:
        """As :meth:`enqueue`, on a SQLAlchemy ``AsyncSession``/``AsyncConnection``
        or a psycopg ``AsyncConnection``."""
        plan = self._enqueue_plan(
            url=url,
            idempotency_key=idempotency_key,
            json=json,
            body=body,
            content_type=content_type,
            method=method,
            headers=headers,
            ordering_key=ordering_key,
            available_at=available_at,
            max_attempts=max_attempts,
        )
        with schema_required(self.schema):
            return await run_async(tx, plan)

    def _enqueue_plan(
        self,
        *,
        url: str,
        idempotency_key: str,
        json: Any,
        body: bytes | str | None,
        content_type: str | None,
        method: str,
        headers: Mapping[str, str] | None,
        ordering_key: str | None,
        available_at: datetime | None,
        max_attempts: int | None,
    ) -> Plan[int]:
        """Validate the message now (nothing is sent for bad input), then the plan:
        insert it unless its key exists for its target; return the id."""
        message = build_message(
            url=url,
            idempotency_key=idempotency_key,
            json=json,
            body=body,
            content_type=content_type,
            method=method,
            headers=headers,
            ordering_key=ordering_key,
            available_at=available_at,
            max_attempts=max_attempts,
            default_max_attempts=self.max_attempts,
            max_body_bytes=self.max_body_bytes,
        )
        return self._insert_plan(message.params(current_trace_context()))

    def _insert_plan(self, params: dict[str, Any]) -> Plan[int]:
        insert = self.queries["enqueue_notify" if self.notify else "enqueue"]
        ids: list[int] = yield insert, params, scalar
        if ids:
            return ids[0]
        found: list[_Existing] = yield self.queries["enqueue_existing"], params, _Existing
        if not found:
            raise OutboxError(
                "idempotency key conflicted but no message holds it; "
                "was it removed concurrently by retention?"
            )
        existing = found[0]
        if existing.digest is not None and bytes(existing.digest) != params["digest"]:
            raise IdempotencyKeyReused(params["idempotency_key"], message_id=existing.id)
        return existing.id

    def publish(
        self,
        tx: Any,
        event_type: str,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        ordering_key: str | None = None,
        tenant: str | None = None,
    ) -> list[int]:
        """Fan an event out to every enabled endpoint subscribed to ``event_type``,
        in the caller's transaction; return one message id per endpoint.

        With ``tenant`` (a tenant's external id, see :class:`outbox.Tenants`),
        the endpoints are that tenant's only, and the event key is the tenant's
        own: two tenants may each publish ``"order-1"``. A tenant not created
        yet has no endpoints: nothing is written and ``[]`` returned. Without
        it, the endpoints are those that belong to no tenant: an event
        published for nobody never reaches a tenant's endpoint.

        The body is the Standard Webhooks envelope
        ``{"type": ..., "timestamp": ..., "data": payload}``. Each endpoint's
        message is keyed ``"<idempotency_key>:<endpoint id>"`` (that is also its
        ``webhook-id``). An event key is published once: publishing it again
        writes nothing, not even for endpoints subscribed since, and returns the
        first publish's ids; with another ``event_type`` or ``payload`` it raises
        :class:`outbox.IdempotencyKeyReused`. Without a key, a random one is made
        (no dedupe). An endpoint with a filter met without the ``filters`` extra
        installed raises :class:`outbox.ConfigurationError`, and nothing is written.
        """
        params, verdicts = self._event(event_type, payload, idempotency_key, ordering_key, tenant)
        with schema_required(self.schema):
            return run_sync(tx, self._publish_plan(params, verdicts))

    async def publish_async(
        self,
        tx: Any,
        event_type: str,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        ordering_key: str | None = None,
        tenant: str | None = None,
    ) -> list[int]:
        """As :meth:`publish`, on an asynchronous transaction."""
        params, verdicts = self._event(event_type, payload, idempotency_key, ordering_key, tenant)
        with schema_required(self.schema):
            return await run_async(tx, self._publish_plan(params, verdicts))

    def _event(
        self,
        event_type: object,
        payload: object,
        key: object,
        ordering_key: object,
        tenant: object = None,
    ) -> tuple[dict[str, Any], Verdicts]:
        """The parameters of the ``publish`` statement, and the verdicts of
        endpoint filters on the payload (none judged yet)."""
        event_type = check_published_type(event_type)
        event_key = check_optional_key(key, "idempotency_key")
        if event_key is not None and len(event_key) > MAX_EVENT_KEY:
            raise InvalidMessage(
                "idempotency_key", f"is longer than {MAX_EVENT_KEY} characters (events)"
            )
        if payload is None:  # JSON null: an event says something
            raise InvalidMessage("payload", "must not be null")
        # bounded before it is encoded, and before endpoint filters walk it
        check_json(payload, "payload", text=False, max_values=self.max_body_bytes // 2 + 2)
        envelope = {
            "type": event_type,
            "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "data": payload,
        }
        try:
            body, _ = encode_body(
                json=envelope, body=None, content_type=None, max_body_bytes=self.max_body_bytes
            )
            # the payload alone, for the digest: the envelope's timestamp changes
            data, _ = encode_body(
                json=payload, body=None, content_type=None, max_body_bytes=self.max_body_bytes
            )
        except InvalidMessage as exc:
            raise InvalidMessage("payload", exc.problem) from None
        params = {
            "event_type": event_type,
            "event_key": event_key or "evt_" + uuid.uuid4().hex,
            "digest": event_digest(event_type=event_type, payload=data),
            "body": body,
            "ordering_key": check_optional_key(ordering_key, "ordering_key"),
            "tenant": None if tenant is None else check_tenant_id(tenant, "tenant"),
            "max_attempts": self.webhook_max_attempts,
            "trace_context": current_trace_context(),
        }
        return params, Verdicts(data, event_type)

    def _publish_plan(self, params: dict[str, Any], verdicts: Verdicts) -> Plan[list[int]]:
        statement = self.queries["publish_notify" if self.notify else "publish"]
        for _ in range(PUBLISH_ROUNDS):
            params = {
                **params,
                "evaluated": list(verdicts.evaluated),
                "matched": list(verdicts.matched),
            }
            (row,) = yield statement, params, _Published
            if not row.tenant_known:
                return []  # a tenant not created yet: it has no endpoints
            if row.created_ids is not None or row.existing_ids is not None:
                break
            if not row.unevaluated:
                break  # a concurrent publish of the key: read below
            # nothing was written: the filters met for the first time (or changed
            # since the last round) are judged, then the event published again
            verdicts.judge(row.unevaluated)
        else:
            raise OutboxError(
                f"the subscribed endpoints' filters changed during each of {PUBLISH_ROUNDS} "
                "rounds of publish; nothing was written"
            )
        if row.created_ids is not None:
            return sorted(row.created_ids)
        if row.existing_ids is not None and row.digest is not None:
            event = _Event(row.existing_ids, row.digest)
        else:
            # an event that a concurrent transaction committed while this one waited
            found: list[_Event] = yield (
                self.queries["publish_existing"],
                {"event_key": params["event_key"], "tenant": params["tenant"]},
                _Event,
            )
            if not found:
                raise OutboxError(
                    "event key conflicted but no event holds it; "
                    "was it removed concurrently by retention?"
                )
            event = found[0]
        if bytes(event.digest) != params["digest"]:
            raise IdempotencyKeyReused(params["event_key"])
        return sorted(event.message_ids)
