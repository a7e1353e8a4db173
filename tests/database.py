"""The test's database, as producers, dispatchers and operators meet it: messages
enqueued, published, made dead with recorded attempts, leases expired, through
short-lived connections."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg

from outbox import Outbox
from outbox.endpoints import Endpoints

Conn = psycopg.Connection[tuple[Any, ...]]


class Db:
    """The test's database: short-lived connections, each one transaction committed
    on success, and what tests do to it (enqueue, publish, make dead, expire)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def tx(self) -> Conn:
        return psycopg.connect(self.url)

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.tx() as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def enqueue(self, key: str, url: str = "https://example.com/hook", **kwargs: Any) -> int:
        kwargs.setdefault("json", {"key": key})
        with self.tx() as conn:
            return Outbox().enqueue(conn, url=url, idempotency_key=key, **kwargs)

    def endpoint(self, url: str = "https://example.com/wh", **kwargs: Any) -> int:
        with self.tx() as conn:
            return Endpoints().add(conn, url=url, **kwargs).id

    def publish(self, event_type: str, key: str) -> list[int]:
        with self.tx() as conn:
            return Outbox().publish(conn, event_type, {"key": key}, idempotency_key=key)

    def kill(
        self,
        message_id: int,
        *,
        attempts: int = 3,
        died: timedelta = timedelta(0),
        error: str = "HTTP 500 Internal Server Error",
    ) -> None:
        """Make the message dead after ``attempts`` recorded failed attempts."""
        self.query(
            "UPDATE outbox.messages SET state = 'dead', attempts = %s, last_status = 500,"
            " last_error = %s, completed_at = now() - %s WHERE id = %s",
            attempts,
            error,
            died,
            message_id,
        )
        for n in range(1, attempts + 1):
            self.query(
                "INSERT INTO outbox.attempts (message_id, attempt, owner, started_at,"
                " duration_ms, status, outcome, error_class, error)"
                " VALUES (%s, %s, 'test:1:x', now(), 5, 500, %s, 'http_500', %s)",
                message_id,
                n,
                "failed" if n == attempts else "retry",
                error,
            )

    def row(self, message_id: int) -> tuple[Any, ...]:
        (row,) = self.query(
            "SELECT state, attempts, max_attempts, completed_at IS NULL,"
            " available_at <= now(), idempotency_key FROM outbox.messages WHERE id = %s",
            message_id,
        )
        return row

    def expire(self, message_id: int) -> None:
        """End the message's lease now (as if its dispatcher froze past it)."""
        self.query(
            "UPDATE outbox.messages SET lease_until = now() - interval '1 second'"
            " WHERE id = %s RETURNING id",
            message_id,
        )
