"""What a claim hands the dispatcher: a :class:`Job` per claimed message, made
by the claim statements' row factory, and the :class:`Completion` that records
its outcome."""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import BaseRowFactory, RowMaker

from dispatchers.rows import result_names, taker
from dispatchers.tls import TlsContexts
from dispatchers.unsealing import OpenedSecrets


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed message: what to send, and the attempt number that fences it."""

    id: int
    idempotency_key: str
    url: str
    method: str
    headers: dict[str, str]
    body: bytes
    content_type: str
    attempts: int
    max_attempts: int
    endpoint_id: int | None
    event_type: str | None
    created_at: datetime
    destination: str  # what the dispatcher bounds requests in flight by
    retry_base: int = 0
    secrets: tuple[str, ...] = ()
    """The signing secrets in force, opened (see :mod:`dispatchers.unsealing`)."""
    ordering_key: str | None = None
    trace_context: dict[str, str] | None = None
    """The W3C context (``traceparent``, ``tracestate``) of the span that wrote
    the message: each attempt's span is its child (:mod:`dispatchers.tracing`)."""
    retry_schedule: list[float] | None = None
    """The delays before its retries: its endpoint's schedule, else its event
    type's, else None for the dispatcher's default (:func:`dispatchers.retry.policy_for`)."""
    probe: bool = False
    """The one request sent to a destination whose circuit breaker is open (see
    :mod:`dispatchers.health`): its outcome closes the breaker or opens it again."""
    tls: ssl.SSLContext | None = None
    """The endpoint's own TLS context, for its CA bundle or client certificate
    (see :mod:`dispatchers.tls`); None: the default one."""
    secrets_unavailable: str | None = None
    """Why the endpoint's secrets or client key could not be opened (naming the
    key): the message must not be sent unsigned, or without its certificate."""

    def __repr__(self) -> str:  # never show secrets or payloads
        return f"Job(id={self.id}, attempts={self.attempts}, endpoint_id={self.endpoint_id})"


_CLAIMED = tuple(field.name for field in dataclasses.fields(Job))[:-2]
"""The columns of a claim that are :class:`Job` fields, in their order (every
field but the last two, ``tls`` and ``secrets_unavailable``, which opening the
secrets and the client key decides)."""
_TLS = ("ca_bundle", "client_cert", "client_key", "client_key_id")
"""The columns of the endpoint's TLS material (see :mod:`dispatchers.tls`)."""
_COLUMNS = (*_CLAIMED, "secret_keys", *_TLS)
_ENDPOINT_ID = _CLAIMED.index("endpoint_id")
_SECRETS = _CLAIMED.index("secrets")
_SECRET_KEYS = len(_CLAIMED)


def job_rows(
    secrets: OpenedSecrets, tls: TlsContexts
) -> BaseRowFactory[Job | float | None]:
    """The row factory of the claim statements: a :class:`Job` per claimed message
    (its columns found by name once per result, see :mod:`dispatchers.rows`), its
    secrets opened by ``secrets``, its endpoint's TLS context from ``tls``; for the
    row without an id, the seconds until a rate slot frees (its ``rate_wait_s``,
    in "claim"), else None (the row of "claim_uncapped" that says destinations
    with a policy hold more)."""

    def factory(cursor: Any) -> RowMaker[Job | float | None]:
        names = result_names(cursor)
        take = taker(names, _COLUMNS)
        wait = names.index("rate_wait_s") if "rate_wait_s" in names else None

        def make(values: Sequence[Any]) -> Job | float | None:
            fields = list(take(values))
            if fields[0] is None:
                return None if wait is None else values[wait]
            endpoint_id = fields[_ENDPOINT_ID]
            fields[_SECRETS], unavailable = secrets.open(
                endpoint_id, fields[_SECRETS], fields[_SECRET_KEYS]
            )
            context, key_unavailable = tls.context(endpoint_id, *fields[_SECRET_KEYS + 1 :])
            fields[_SECRET_KEYS:] = (context, unavailable or key_unavailable)
            return Job(*fields)

        return make

    return factory


@dataclass(frozen=True, slots=True)
class Completion:
    """The outcome of one claim, as the completion batch writes it."""

    id: int
    attempt: int
    state: str  # delivered | ready | dead
    outcome: str  # delivered | retry | failed | gone | released
    sent: bool
    delay: float = 0.0
    status: int | None = None
    error_class: str | None = None
    error: str | None = None
    started_at: datetime | None = None
    duration_ms: int | None = None
    excerpt: str | None = None
    endpoint_id: int | None = None
    trace_id: str | None = None
