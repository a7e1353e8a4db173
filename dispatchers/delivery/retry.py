"""Retry timing: how long to wait before the next delivery attempt.

Everything here is pure. A policy maps the stored attempt count (the number of attempts
already made, so 1 after the first failure) to a delay in seconds; the dispatcher writes
``now() + delay`` to the row and nothing sleeps in-process.

A server's ``Retry-After`` can only lengthen a delay, and only up to ``max_retry_after``.
No delay is longer than :data:`MAX_DELAY`: the policies here refuse settings beyond
it, and :func:`bounded_delay` holds any policy's answer (a user's too) within it, so
``now() + delay`` always fits a timestamp and the outcome write cannot fail for it.
"""

from __future__ import annotations

import functools
import math
import random as _random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Protocol

from outbox.defaults import MAX_RETRY_DELAY
from outbox.errors import ConfigurationError

__all__ = [
    "DEFAULT_MAX_RETRY_AFTER",
    "MAX_DELAY",
    "STANDARD_WEBHOOKS_SCHEDULE",
    "ExponentialBackoff",
    "RetryPolicy",
    "Schedule",
    "bounded_delay",
    "parse_retry_after",
    "policy_for",
]

DEFAULT_MAX_RETRY_AFTER = 6 * 3600.0
"""Longest wait a server's ``Retry-After`` can impose (6 hours)."""

MAX_DELAY = MAX_RETRY_DELAY
"""The longest delay before a next attempt (a week)."""

_RETRY_AFTER_LIMIT = 10 * 365 * 86400.0
"""``Retry-After`` values further out than this (10 years) are treated as garbage."""


def _jittered(nominal: float, jitter: float, random: Callable[[], float]) -> float:
    """``nominal`` times a uniform factor in ``[1 - jitter, 1 + jitter]``."""
    if jitter == 0:
        return nominal
    r = min(1.0, max(0.0, random()))
    return nominal * (1.0 - jitter + 2.0 * jitter * r)


def _honour_retry_after(
    computed: float, retry_after: float | None, max_retry_after: float
) -> float:
    """Lengthen ``computed`` to ``retry_after``, bounded by ``max_retry_after``."""
    if retry_after is None or math.isnan(retry_after):
        return computed
    return max(computed, min(max(retry_after, 0.0), max_retry_after))


def _check_attempt(attempt: int) -> None:
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt!r}")


def bounded_delay(delay: float) -> float:
    """``delay`` held from 0 to :data:`MAX_DELAY` (``nan`` is 0, ``inf`` the maximum)."""
    return min(delay, MAX_DELAY) if delay > 0 else 0.0


def _check_max_retry_after(value: float) -> None:
    _require(0 <= value <= MAX_DELAY, "max_retry_after", f"from 0 to {MAX_DELAY:g}", value)


def _require(ok: bool, field: str, rule: str, value: object) -> None:
    if not ok:
        raise ConfigurationError(f"{field} must be {rule}, got {value!r}")


class RetryPolicy(Protocol):
    """Maps an attempt count to the delay before the next attempt."""

    def delay(self, attempt: int, *, retry_after: float | None = None) -> float:
        """Seconds until the next attempt, given ``attempt`` attempts already made."""
        ...


@dataclass(frozen=True)
class ExponentialBackoff:
    """``base * factor**(attempt - 1)`` seconds, capped at ``cap``, with jitter.

    ``jitter`` is a fraction: the delay is multiplied by a uniform factor in
    ``[1 - jitter, 1 + jitter]`` and then capped again. ``random`` returns values in
    ``[0, 1)`` and is injectable for tests.
    """

    base: float = 2.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.2
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    random: Callable[[], float] = _random.random

    def __post_init__(self) -> None:
        _require(math.isfinite(self.base) and self.base > 0, "base", "> 0", self.base)
        _require(math.isfinite(self.factor) and self.factor >= 1, "factor", ">= 1", self.factor)
        _require(self.base <= self.cap <= MAX_DELAY, "cap", f"from base to {MAX_DELAY:g}", self.cap)
        _require(0 <= self.jitter < 1, "jitter", "in [0, 1)", self.jitter)
        _check_max_retry_after(self.max_retry_after)

    def delay(self, attempt: int, *, retry_after: float | None = None) -> float:
        """Seconds until the next attempt, given ``attempt`` attempts already made."""
        _check_attempt(attempt)
        try:
            nominal = min(self.cap, self.base * self.factor ** (attempt - 1))
        except OverflowError:
            nominal = self.cap
        computed = min(self.cap, _jittered(nominal, self.jitter, self.random))
        return _honour_retry_after(computed, retry_after, self.max_retry_after)


@dataclass(frozen=True)
class Schedule:
    """A fixed list of delays; attempts past its end reuse the last one.

    Attempt ``n`` waits ``delays[min(n - 1, len(delays) - 1)]`` seconds, multiplied by a
    uniform factor in ``[1 - jitter, 1 + jitter]``.
    """

    delays: tuple[float, ...]
    jitter: float = 0.1
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    random: Callable[[], float] = _random.random

    def __post_init__(self) -> None:
        _require(len(self.delays) > 0, "delays", "non-empty", self.delays)
        _require(
            all(0 <= d <= MAX_DELAY for d in self.delays),
            "delays",
            f"from 0 to {MAX_DELAY:g}",
            self.delays,
        )
        _require(0 <= self.jitter < 1, "jitter", "in [0, 1)", self.jitter)
        _check_max_retry_after(self.max_retry_after)

    def delay(self, attempt: int, *, retry_after: float | None = None) -> float:
        """Seconds until the next attempt, given ``attempt`` attempts already made."""
        _check_attempt(attempt)
        nominal = self.delays[min(attempt - 1, len(self.delays) - 1)]
        computed = _jittered(nominal, self.jitter, self.random)
        return _honour_retry_after(computed, retry_after, self.max_retry_after)


STANDARD_WEBHOOKS_SCHEDULE = Schedule(delays=(5, 300, 1800, 7200, 18000, 36000, 36000))
"""5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h: about a day, as Standard Webhooks suggests."""


def policy_for(schedule: Sequence[float] | None, default: RetryPolicy) -> RetryPolicy:
    """The policy of a message whose claim found ``schedule`` (its endpoint's, else
    its event type's, else None): a :class:`Schedule` of those delays, jittered
    and honouring ``Retry-After`` as the default webhook schedule does, or
    ``default`` when there is none."""
    if schedule is None:
        return default
    return _stored_schedule(tuple(schedule))


@functools.lru_cache(maxsize=256)
def _stored_schedule(delays: tuple[float, ...]) -> Schedule:
    """One :class:`Schedule` per distinct stored schedule, made once (a claim hands
    the same few schedules over and over)."""
    return Schedule(delays=delays)


def parse_retry_after(value: str | None, *, now: datetime) -> float | None:
    """Parse a ``Retry-After`` header into seconds from ``now``.

    Accepts delta-seconds (``"120"``) or an HTTP-date; a date in the past gives ``0.0``.
    Returns ``None`` for a missing, malformed, negative or absurd (over 10 years) value.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if text.isascii() and text.isdigit():
        seconds = float(int(text)) if len(text) <= 20 else math.inf
    else:
        try:
            when = parsedate_to_datetime(text)
        except (ValueError, TypeError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:  # "-0000": HTTP-dates are always GMT
            when = when.replace(tzinfo=UTC)
        seconds = max(0.0, (when - now).total_seconds())
    if seconds > _RETRY_AFTER_LIMIT:
        return None
    return seconds
