"""What the claim statements return (a :class:`Claimed` per message, a :class:`Signal`
for the row without one, gathered in a :class:`ClaimResult`) and what the completion
statements write (a :class:`Completion` per outcome)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from psycopg.rows import RowMaker

from dispatchers.store.rows import result_names, taker


class Claimed(NamedTuple):
    """A message as a claim statement returns it (its columns taken by name, see
    :mod:`dispatchers.store.rows`): its signing secrets and its endpoint's
    credentials still sealed, its endpoint's TLS material not yet made a context.
    :class:`Opener` makes the :class:`Job`."""

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
    auth: str | None
    """The endpoint's credentials, one JSON value, sealed when ``auth_key_id`` says so."""
    auth_key_id: str | None


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
