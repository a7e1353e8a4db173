"""The application-facing API: write outbox messages inside your own transaction."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from outbox.errors import ConfigurationError, OutboxError
from outbox.message import DEFAULT_MAX_BODY_BYTES, MAX_ATTEMPTS_LIMIT, NewMessage, build_message
from outbox.queries import Queries, queries_for
from outbox.transaction import Plan, run_async, run_sync

DEFAULT_SCHEMA = "outbox"
DEFAULT_MAX_ATTEMPTS = 12


class Outbox:
    """Settings for writing outbox messages. Holds no connection.

    :param schema: the PostgreSQL schema of the outbox tables.
    :param notify: wake listening dispatchers when the transaction commits
        (one ``NOTIFY`` per transaction, folded by PostgreSQL). Turn it off when
        dispatchers only poll, for example behind PgBouncer in transaction mode.
    :param max_body_bytes: the largest body ``enqueue`` accepts.
    :param max_attempts: the attempt budget of a message that does not give one.
    """

    def __init__(
        self,
        *,
        schema: str = DEFAULT_SCHEMA,
        notify: bool = True,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ) -> None:
        self.queries: Queries = queries_for(schema)
        if (
            isinstance(max_body_bytes, bool)
            or not isinstance(max_body_bytes, int)
            or (max_body_bytes < 1)
        ):
            raise ConfigurationError("max_body_bytes: must be a positive integer")
        if (
            isinstance(max_attempts, bool)
            or not isinstance(max_attempts, int)
            or not (1 <= max_attempts <= MAX_ATTEMPTS_LIMIT)
        ):
            raise ConfigurationError(f"max_attempts: must be between 1 and {MAX_ATTEMPTS_LIMIT}")
        self.schema = schema
        self.notify = bool(notify)
        self.max_body_bytes = max_body_bytes
        self.max_attempts = max_attempts

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

        ``tx`` is a SQLAlchemy ``Session`` or ``Connection`` or a psycopg
        ``Connection``; the row is written in its open transaction, which this
        method never commits. Enqueuing the same ``idempotency_key`` for the
        same ``url`` again returns the first message's id and writes nothing.
        Give exactly one of ``json`` (serialised compactly, ``application/json``)
        or ``body`` (bytes, or str sent as UTF-8). Raises
        :class:`outbox.InvalidMessage`, naming the field, for bad input.
        """
        message = self._build(locals())
        return run_sync(tx, self._enqueue_plan(message))

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
        message = self._build(locals())
        return await run_async(tx, self._enqueue_plan(message))

    def _build(self, args: dict[str, Any]) -> NewMessage:
        return build_message(
            url=args["url"],
            idempotency_key=args["idempotency_key"],
            json=args["json"],
            body=args["body"],
            content_type=args["content_type"],
            method=args["method"],
            headers=args["headers"],
            ordering_key=args["ordering_key"],
            available_at=args["available_at"],
            max_attempts=args["max_attempts"],
            default_max_attempts=self.max_attempts,
            max_body_bytes=self.max_body_bytes,
        )

    def _enqueue_plan(self, message: NewMessage) -> Plan[int]:
        """Insert ``message`` unless its key exists for its target; return the id."""
        params = message.params()
        params["channel"] = self.queries.channel
        insert = self.queries["enqueue_notify" if self.notify else "enqueue"]
        rows = yield insert, params
        if rows:
            return int(rows[0][0])
        rows = yield self.queries["enqueue_existing"], params
        if not rows:
            raise OutboxError(
                "idempotency key conflicted but no message holds it; "
                "was it removed concurrently by retention?"
            )
        return int(rows[0][0])
