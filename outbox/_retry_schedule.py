"""A stored retry schedule, checked before it is written: the delays, in seconds,
before each retry of a webhook to an endpoint or of an event type; its last
delay repeats until the message's attempts are spent.

Migration 0017 holds the same rule as a domain; checked here first, a bad
schedule raises :class:`outbox.InvalidArgument` naming the field and aborts
nothing in the caller's transaction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from outbox.defaults import MAX_RETRY_DELAY, MAX_RETRY_SCHEDULE
from outbox.errors import InvalidMessage


def check_retry_schedule(value: object, field: str = "retry_schedule") -> list[float] | None:
    """None (no schedule of its own), or the delays as floats: 1 to
    :data:`~outbox.defaults.MAX_RETRY_SCHEDULE` of them, each a number of seconds
    above 0 and at most :data:`~outbox.defaults.MAX_RETRY_DELAY`. Raises
    :class:`~outbox.InvalidMessage` (an :class:`~outbox.InvalidArgument`)
    naming ``field``."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidMessage(field, "must be a list of delays in seconds")
    delays = list(value)
    if not 1 <= len(delays) <= MAX_RETRY_SCHEDULE:
        raise InvalidMessage(field, f"must list 1 to {MAX_RETRY_SCHEDULE} delays")
    for delay in delays:
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise InvalidMessage(field, f"delays must be numbers of seconds, not {delay!r}")
        if not (math.isfinite(delay) and 0 < delay <= MAX_RETRY_DELAY):
            raise InvalidMessage(
                field, f"delays must be above 0 and at most {MAX_RETRY_DELAY:g} s, not {delay!r}"
            )
    return [float(d) for d in delays]
