"""A destination's rate limit and burst, checked before they are written (shared by
:mod:`outbox.destinations` and :mod:`outbox.endpoints`).

A rate limit of R requests per second with a burst of B is stored as B rate
slots, each usable once every B / R seconds (migration 0014 says why): the burst
is both how many requests may start at once after an idle spell and how many
rows a claim may take of that destination at a time.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from outbox.errors import InvalidMessage

MAX_RATE_LIMIT = 10_000.0
"""The highest rate limit, in requests per second."""
MIN_RATE_LIMIT = 0.001
"""The lowest: one request every 1000 seconds."""
MAX_BURST = 100
"""The largest burst (rate slot rows per destination)."""
DEFAULT_MAX_BURST = 10
"""The largest default burst (see :func:`default_burst`)."""


def default_burst(rate_limit: float) -> int:
    """The burst of a rate limit set without one: about a second's worth of
    requests, from 1 to :data:`DEFAULT_MAX_BURST` (so 20/s bursts 10 and refills
    one slot each 0.5 s; 0.5/s bursts 1). Migration 0014 computes the same for
    the endpoints whose limit it starts enforcing."""
    return min(DEFAULT_MAX_BURST, max(1, math.ceil(rate_limit)))


def check_rate_limit(value: object, field: str = "rate_limit") -> float | None:
    """Requests per second, from :data:`MIN_RATE_LIMIT` to :data:`MAX_RATE_LIMIT`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidMessage(field, f"must be a number, not {type(value).__name__}")
    if not MIN_RATE_LIMIT <= value <= MAX_RATE_LIMIT:  # NaN fails too
        raise InvalidMessage(
            field, f"must be from {MIN_RATE_LIMIT:g} to {MAX_RATE_LIMIT:g} requests per second"
        )
    return float(value)


def check_burst(value: object, rate_limit: float | None) -> int | None:
    """The burst of ``rate_limit`` (checked): ``value``, or the default for it; a
    burst without a rate limit is an error."""
    if value is None:
        return None if rate_limit is None else default_burst(rate_limit)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BURST:
        raise InvalidMessage("burst", f"must be an integer from 1 to {MAX_BURST}")
    if rate_limit is None:
        raise InvalidMessage("burst", "needs a rate limit")
    return value


def rate_fields(rate_limit: object, burst: object) -> dict[str, Any]:
    """The ``rate_limit`` and ``burst`` to store, checked (a limit without a
    burst gets the default one)."""
    rate = check_rate_limit(rate_limit)
    return {"rate_limit": rate, "burst": check_burst(burst, rate)}


class RateChange(NamedTuple):
    """A rate limit and its burst, as stored or as an update gives them."""

    rate_limit: float | None
    burst: int | None


def check_rate_change(rate_limit: object, burst: object, *, clear: bool) -> RateChange | None:
    """An update's change of a rate limit: None for no change, both None to
    remove the limit, else the limit (checked) and burst as given (checked by
    :func:`changed_rate`, which knows the limit it goes with)."""
    if rate_limit is None and burst is None:
        return RateChange(None, None) if clear else None
    if clear:
        raise InvalidMessage("rate_limit", "give a rate limit or remove it, not both")
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int)):
        raise InvalidMessage("burst", f"must be an integer from 1 to {MAX_BURST}")
    return RateChange(check_rate_limit(rate_limit), burst)


def changed_rate(current: RateChange, change: RateChange | None) -> dict[str, Any]:
    """The ``rate_limit`` and ``burst`` to store after ``change``: a burst alone
    changes the current limit's; a new limit without a burst gets the default."""
    if change is None:
        return current._asdict()
    rate = current.rate_limit if change.rate_limit is None and change.burst else change.rate_limit
    return {"rate_limit": rate, "burst": check_burst(change.burst, rate)}
