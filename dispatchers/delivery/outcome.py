"""Classify one HTTP attempt, and decide the message's next state from it.

Pure functions: the HTTP shell turns a response or an exception into an ``Outcome``
(``classify_response`` / ``classify_exception``), and ``decide`` turns that outcome and
the stored attempt count into a ``Decision`` the completion batch writes.

Error texts are short, bounded, and never contain request or response payloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from http import HTTPStatus
from typing import Literal, assert_never

import httpx

from dispatchers.delivery.retry import RetryPolicy, bounded_delay, parse_retry_after
from dispatchers.delivery.ssrf import BlockedDestination

__all__ = [
    "ABORT_HEADER",
    "DEFAULT_RETRY_STATUSES",
    "MAX_ERROR_LENGTH",
    "Decision",
    "Outcome",
    "Verdict",
    "classify_exception",
    "classify_response",
    "decide",
]

DEFAULT_RETRY_STATUSES: frozenset[int] = frozenset({408, 425, 429})
"""Non-5xx statuses worth retrying: Request Timeout, Too Early, Too Many Requests."""

ABORT_HEADER = "outbox-abort"
"""A receiver answering with this header set to ``true`` (any case) stops the
retries of the message: unless the answer is a 2xx (delivered), it is dead at once."""

MAX_ERROR_LENGTH = 500
"""Longest ``Outcome.error`` text, in characters."""

_MAX_CHAIN = 16
"""How many chained or grouped exceptions to inspect when looking for a blocked destination."""

_TIMEOUT_NAMES: tuple[tuple[type[httpx.TimeoutException], str], ...] = (
    (httpx.ConnectTimeout, "connect timeout"),
    (httpx.ReadTimeout, "read timeout"),
    (httpx.WriteTimeout, "write timeout"),
    (httpx.PoolTimeout, "pool timeout"),
)


class Verdict(StrEnum):
    """What one attempt amounted to."""

    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"
    """Permanent failure: the message is dead."""
    GONE = "gone"
    """HTTP 410: permanent, and the endpoint must be disabled."""
    BLOCKED = "blocked"
    """Refused by the SSRF guard before anything was sent: a setting of the
    dispatcher, not a fault of the message, which is held unsent (its attempt
    refunded) rather than spent."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """The classified result of one HTTP attempt.

    ``error_class`` is a stable machine label (``"http_500"``, ``"timeout"``, ...);
    ``error`` is short human-readable text; ``retry_after`` is the server's requested
    delay in seconds, when it sent a usable one with a retryable status.
    """

    verdict: Verdict
    status: int | None
    error: str | None
    error_class: str | None
    retry_after: float | None


@dataclass(frozen=True, slots=True)
class Decision:
    """The message's next state: ``delay`` is in seconds and is 0 unless ``ready``."""

    state: Literal["delivered", "ready", "dead"]
    delay: float
    disable_endpoint: bool


def classify_response(
    status: int,
    headers: Mapping[str, str],
    *,
    now: datetime | None = None,
    retry_statuses: frozenset[int] = DEFAULT_RETRY_STATUSES,
) -> Outcome:
    """Classify a response by status (``now``, default the current time, dates an
    HTTP-date ``Retry-After``).

    2xx succeed; any other answer with :data:`ABORT_HEADER` ``true`` fails
    permanently, whatever its status (the receiver asked for no more attempts); 5xx
    and ``retry_statuses`` retry, carrying any ``Retry-After``; 410 is gone; 3xx
    (never followed) and every other status fail permanently. A status listed in
    ``retry_statuses`` retries even when it is 410 or 3xx.
    """
    if 200 <= status <= 299:
        return Outcome(Verdict.DELIVERED, status, None, None, None)
    if (_header(headers, ABORT_HEADER) or "").strip().lower() == "true":
        return Outcome(
            Verdict.FAILED,
            status,
            f"the receiver stopped retries ({_status_text(status)} with Outbox-Abort: true)",
            "aborted",
            None,
        )
    if status in retry_statuses or 500 <= status <= 599:
        retry_after = parse_retry_after(
            _header(headers, "retry-after"), now=now or datetime.now(UTC)
        )
        return Outcome(Verdict.RETRY, status, _status_text(status), f"http_{status}", retry_after)
    if 300 <= status <= 399:
        return Outcome(
            Verdict.FAILED, status, f"redirect not followed (HTTP {status})", "redirect", None
        )
    if status == 410:
        return Outcome(Verdict.GONE, status, _status_text(status), "http_410", None)
    if 100 <= status <= 599:
        return Outcome(Verdict.FAILED, status, _status_text(status), f"http_{status}", None)
    return Outcome(Verdict.FAILED, status, f"invalid HTTP status {status}", "invalid_status", None)


def classify_exception(exc: BaseException) -> Outcome:
    """Classify an exception raised while sending a request or reading its response.

    A ``BlockedDestination`` anywhere in the cause/context chain is ``BLOCKED``
    (nothing was sent: the dispatcher's guard refused the address).
    Timeouts, connection, protocol and other transport errors retry; an invalid URL or
    unsupported scheme fails; anything unexpected retries as ``internal_error`` with only
    the exception's type name as text. Non-``Exception`` errors such as cancellation
    should normally propagate instead; if classified they retry as ``interrupted``.
    """
    blocked = _find_blocked(exc)
    if blocked is not None:
        return Outcome(Verdict.BLOCKED, None, _bounded(str(blocked)), "blocked_destination", None)
    if isinstance(exc, httpx.InvalidURL):
        return _failed("invalid_url", _described("invalid URL", exc))
    if isinstance(exc, httpx.UnsupportedProtocol):
        return _failed("unsupported_protocol", _described("unsupported protocol", exc))
    if isinstance(exc, httpx.TooManyRedirects):
        return _failed("redirect", _described("redirect not followed", exc))
    if isinstance(exc, httpx.TimeoutException):
        name = next((n for t, n in _TIMEOUT_NAMES if isinstance(exc, t)), "timeout")
        return _retry("timeout", _described(name, exc))
    if isinstance(exc, httpx.ConnectError):
        return _retry("connect_error", _described("connect error", exc))
    if isinstance(exc, httpx.ProtocolError):
        return _retry("protocol_error", _described("protocol error", exc))
    if isinstance(exc, httpx.TransportError):
        return _retry("network_error", _described("network error", exc))
    if isinstance(exc, Exception):
        return _retry("internal_error", _bounded(f"internal error: {type(exc).__name__}"))
    return _retry("interrupted", _bounded(f"interrupted: {type(exc).__name__}"))


def decide(
    outcome: Outcome,
    *,
    attempts: int,
    max_attempts: int,
    policy: RetryPolicy,
    retry_base: int = 0,
) -> Decision:
    """Next state after an attempt; ``attempts`` counts attempts made, this one included.

    The retry delay is the policy's for ``attempts - retry_base``: the attempts of
    the current budget (a redriven message starts its schedule again), held within
    :data:`~dispatchers.delivery.retry.MAX_DELAY` whatever the policy answers.
    ``BLOCKED`` is ready again with no delay of its own: nothing was sent, so the
    caller refunds the attempt and chooses how long to hold it
    (:func:`~dispatchers.runtime.completions.blocked`).
    """
    match outcome.verdict:
        case Verdict.DELIVERED:
            return Decision("delivered", 0.0, disable_endpoint=False)
        case Verdict.FAILED:
            return Decision("dead", 0.0, disable_endpoint=False)
        case Verdict.GONE:
            return Decision("dead", 0.0, disable_endpoint=True)
        case Verdict.BLOCKED:
            return Decision("ready", 0.0, disable_endpoint=False)
        case Verdict.RETRY:
            if attempts >= max_attempts:
                return Decision("dead", 0.0, disable_endpoint=False)
            delay = policy.delay(max(1, attempts - retry_base), retry_after=outcome.retry_after)
            return Decision("ready", bounded_delay(delay), disable_endpoint=False)
        case _:
            assert_never(outcome.verdict)


def _find_blocked(exc: BaseException) -> BlockedDestination | None:
    """The first ``BlockedDestination`` among ``exc``, its causes, contexts and group members."""
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending and len(seen) < _MAX_CHAIN:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BlockedDestination):
            return current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive header lookup that works for plain dicts too."""
    value = headers.get(name)
    if value is not None:
        return value
    return next((v for k, v in headers.items() if k.lower() == name), None)


def _status_text(status: int) -> str:
    try:
        return f"HTTP {status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def _described(label: str, exc: BaseException) -> str:
    detail = str(exc)
    return _bounded(f"{label}: {detail}" if detail else label)


def _bounded(text: str) -> str:
    """Collapse whitespace and truncate to ``MAX_ERROR_LENGTH`` characters."""
    text = " ".join(text.split())
    if len(text) > MAX_ERROR_LENGTH:
        return text[: MAX_ERROR_LENGTH - 3] + "..."
    return text


def _failed(error_class: str, error: str) -> Outcome:
    return Outcome(Verdict.FAILED, None, error, error_class, None)


def _retry(error_class: str, error: str) -> Outcome:
    return Outcome(Verdict.RETRY, None, error, error_class, None)
