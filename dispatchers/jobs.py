"""What a claim hands the dispatcher: a :class:`Job` per claimed message, made
by the claim statements' row factory, and the :class:`Completion` that records
its outcome."""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from psycopg.rows import RowMaker

from dispatchers.rows import result_names, taker
from dispatchers.tls import TlsContexts
from dispatchers.unsealing import OpenedSecrets
from outbox.sealing import Keyring


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


class Claimed(NamedTuple):
    """A message as a claim statement returns it (its columns taken by name, see
    :mod:`dispatchers.rows`): its signing secrets still sealed, its endpoint's TLS
    material not yet made a context. :class:`Opener` makes the :class:`Job`."""

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
    destination: str
    retry_base: int
    secrets: list[str] | None
    """The secrets in force, newest first, each sealed when its key says so."""
    secret_keys: list[str | None] | None
    """The key that sealed each of ``secrets`` (None: stored plain)."""
    ordering_key: str | None
    trace_context: dict[str, str] | None
    retry_schedule: list[float] | None
    probe: bool
    ca_bundle: str | None
    client_cert: str | None
    client_key: str | None
    client_key_id: str | None


class Signal(NamedTuple):
    """The row of a claim statement that holds no message: in ``claim``, when the
    next rate slot of a destination in line frees (``rate_wait_s``); in
    ``claim_uncapped``, that destinations with a policy hold more (and in
    ``claim_lone``, that the destination is not alone), with no wait."""

    rate_wait: float | None


class ClaimResult(NamedTuple):
    """What one claim took, and when to claim again at the latest."""

    messages: list[Claimed]
    rate_wait: float | None = None
    """Seconds until a rate slot of a destination in line frees (None: no rate
    limit held anything back)."""


def claim_rows(cursor: Any) -> RowMaker[Claimed | Signal]:
    """The row factory of the claim statements: a :class:`Claimed` per message, a
    :class:`Signal` for the row without one."""
    names = result_names(cursor)
    take = taker(names, Claimed._fields)
    wait = names.index("rate_wait_s") if "rate_wait_s" in names else None

    def make(values: Sequence[Any]) -> Claimed | Signal:
        fields = take(values)
        if fields[0] is None:
            return Signal(None if wait is None else values[wait])
        return Claimed(*fields)

    return make


class Opener:
    """Makes the :class:`Job` of each claimed message, after the claim: opens its
    sealed signing secrets (:mod:`dispatchers.unsealing`) and builds its
    endpoint's TLS context (:mod:`dispatchers.tls`), both with ``keyring``. A
    message whose secrets or client key cannot be opened gets a job that says why
    (``secrets_unavailable``): it is never sent unsigned."""

    def __init__(self, keyring: Keyring | None) -> None:
        self.secrets = OpenedSecrets(keyring)
        self.tls = TlsContexts(keyring)

    def job(self, claimed: Claimed) -> Job:
        secrets, unavailable = self.secrets.open(
            claimed.endpoint_id, claimed.secrets, claimed.secret_keys
        )
        context, key_unavailable = self.tls.context(
            claimed.endpoint_id,
            claimed.ca_bundle,
            claimed.client_cert,
            claimed.client_key,
            claimed.client_key_id,
        )
        return Job(
            id=claimed.id,
            idempotency_key=claimed.idempotency_key,
            url=claimed.url,
            method=claimed.method,
            headers=claimed.headers,
            body=claimed.body,
            content_type=claimed.content_type,
            attempts=claimed.attempts,
            max_attempts=claimed.max_attempts,
            endpoint_id=claimed.endpoint_id,
            event_type=claimed.event_type,
            created_at=claimed.created_at,
            destination=claimed.destination,
            retry_base=claimed.retry_base,
            secrets=secrets,
            ordering_key=claimed.ordering_key,
            trace_context=claimed.trace_context,
            retry_schedule=claimed.retry_schedule,
            probe=claimed.probe,
            tls=context,
            secrets_unavailable=unavailable or key_unavailable,
        )


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
