"""Destination health: circuit breakers and Retry-After holds, decided in memory.

A :class:`HealthBook` keeps a sliding window of outcomes per destination and says
when to open a breaker or hold a destination; only those transitions are
written, never an outcome. :func:`is_failure` says what counts as a failure (other
4xx count as successes); what never reached the destination (:func:`is_counted`)
does not count at all. Pure, its clock injectable.

Design: docs/explanation/design/destination-health.md
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from enum import StrEnum

from dispatchers.delivery.outcome import Outcome, Verdict
from dispatchers.delivery.settings import BreakerSettings

__all__ = [
    "HOLD_SLACK",
    "HOLD_STATUSES",
    "HealthBook",
    "Transition",
    "hold_for",
    "is_counted",
    "is_failure",
]


HOLD_STATUSES = frozenset({429, 503})
"""The statuses whose ``Retry-After`` holds the whole destination."""

HOLD_SLACK = 1.0
"""Seconds by which a hold must outlast the one a dispatcher wrote last for the
same destination to be written again: a burst of answers with the same
``Retry-After`` writes the hold once."""

_FAILING_STATUSES = frozenset({408, 429})
"""The 4xx statuses that count as failures of the destination."""

_UNCOUNTED_ERRORS = frozenset(
    {"blocked_destination", "invalid_url", "unsupported_protocol", "internal_error"}
)
"""The error classes of attempts that say nothing of the destination's health:
refused by the SSRF guard or unsendable before any request, or failed in our own
code."""

_FAILING_ERRORS = frozenset(
    {"timeout", "connect_error", "protocol_error", "network_error", "oauth2"}
)
"""The error classes of :func:`~dispatchers.delivery.outcome.classify_exception` that count
as failures of the destination (our own errors, such as ``internal_error``, do not), and
an endpoint's OAuth2 token that could not be had (:mod:`dispatchers.delivery.oauth2`)."""


class Transition(StrEnum):
    """A change of a destination's health, as logged and counted."""

    OPENED = "opened"
    """The breaker opened: the destination failed most of its recent attempts."""
    PROBING = "probing"
    """A claim took the one probe request of an open breaker."""
    CLOSED = "closed"
    """The probe succeeded: the destination's messages are claimed again."""
    REOPENED = "reopened"
    """The probe failed: the breaker is open again, for a longer back-off."""
    HELD = "held"
    """A Retry-After holds the destination."""
    PROBE_RETURNED = "probe_returned"
    """The probe never reached the destination (:func:`is_counted`): the breaker
    stays open, and the next claim takes another probe at once."""


def is_counted(outcome: Outcome) -> bool:
    """Whether an attempt's outcome speaks of its destination's health at all."""
    return outcome.status is not None or outcome.error_class not in _UNCOUNTED_ERRORS


def is_failure(outcome: Outcome) -> bool:
    """Whether an attempt's outcome speaks of ill health of its destination."""
    if outcome.verdict is Verdict.DELIVERED or outcome.verdict is Verdict.GONE:
        return False
    status = outcome.status
    if status is None:
        return outcome.error_class in _FAILING_ERRORS
    return status >= 500 or status in _FAILING_STATUSES


def hold_for(outcome: Outcome, max_retry_after: float) -> float | None:
    """Seconds a destination is held after ``outcome``: its ``Retry-After``, at
    most ``max_retry_after``, when it answered 429 or 503 with one; else None."""
    if outcome.status not in HOLD_STATUSES or outcome.retry_after is None:
        return None
    hold = min(max(outcome.retry_after, 0.0), max_retry_after)
    return hold if hold > 0 else None


_BUCKETS = 10
"""A window is kept as this many buckets of counts: its memory and the cost of
noting an outcome do not grow with the traffic, and it slides by a tenth of its
length at a time."""


class _Window:
    """The recent outcomes of one destination: per bucket, its start, attempts
    and failures, oldest first."""

    __slots__ = ("buckets",)

    def __init__(self) -> None:
        self.buckets: collections.deque[list[float]] = collections.deque()

    def add(self, now: float, failed: bool, length: float) -> None:
        buckets = self.buckets
        while buckets and buckets[0][0] <= now - length:
            buckets.popleft()
        if not buckets or buckets[-1][0] + length / _BUCKETS <= now:
            buckets.append([now, 0, 0])
        last = buckets[-1]
        last[1] += 1
        last[2] += failed

    def counts(self) -> tuple[float, float]:
        """Attempts and failures in the window."""
        return sum(b[1] for b in self.buckets), sum(b[2] for b in self.buckets)

    def newest(self) -> float:
        return self.buckets[-1][0]


class HealthBook:
    """One dispatcher's recent outcomes per destination, and what they call for.

    :param settings: when to open a breaker.
    :param clock: seconds, monotonic (default :func:`time.monotonic`).
    """

    def __init__(
        self, settings: BreakerSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._sweep_at = clock() + settings.window
        self._held_until: dict[str, float] = {}  # the holds this book asked for

    def __len__(self) -> int:
        """How many destinations have outcomes in their window."""
        return len(self._windows)

    def note(self, destination: str, outcome: Outcome) -> bool:
        """Note ``outcome`` of an attempt to ``destination``; True when the breaker
        should open now (it just failed, and the window holds ``min_attempts`` or
        more, ``failure_ratio`` of them failed). Opening starts the window afresh."""
        now = self._clock()
        settings = self.settings
        if now >= self._sweep_at:  # destinations gone quiet leave the book
            since = now - settings.window
            self._windows = {d: w for d, w in self._windows.items() if w.newest() > since}
            self._sweep_at = now + settings.window
        if not is_counted(outcome):
            return False
        window = self._windows.get(destination)
        if window is None:
            window = self._windows[destination] = _Window()
        failed = is_failure(outcome)
        window.add(now, failed, settings.window)
        if not failed:
            return False
        attempts, failures = window.counts()
        if attempts >= settings.min_attempts and failures >= settings.failure_ratio * attempts:
            del self._windows[destination]
            return True
        return False

    def hold(self, destination: str, seconds: float) -> bool:
        """Whether a hold of ``seconds`` from now outlasts the one this book last
        asked for ``destination`` by :data:`HOLD_SLACK` or more (and so is to be
        written); if so, it is the one this book asked for now."""
        now = self._clock()
        until = now + seconds
        earlier = self._held_until.get(destination)
        if earlier is not None and earlier + HOLD_SLACK > until:
            return False
        self._held_until = {d: u for d, u in self._held_until.items() if u > now}
        self._held_until[destination] = until
        return True

    def forget(self, destination: str) -> None:
        """Drop ``destination``'s window: its breaker closed, and what failed
        before the probe succeeded no longer counts."""
        self._windows.pop(destination, None)
