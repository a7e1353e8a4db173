"""How long a dispatcher waits before trying the database again after an error.

One type for every loop of the runtime (claims, outcome writes, the maintenance
services, the listener's reconnections): each failure doubles the pause, from
``initial`` up to ``maximum``; a success starts it over. The pause is shortened by
a random fraction of up to ``jitter``, so that dispatchers which met the same
outage do not come back in step.

This is not a delivery retry policy (:mod:`dispatchers.delivery.retry`): those compute the
delay of a message's next attempt from its stored attempt count, and nothing
sleeps for them. This pause is in-process and forgotten on restart.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """The pause after each of a run of consecutive failures.

    :param initial: seconds after the first failure.
    :param maximum: the longest pause, however many failures.
    :param jitter: the largest fraction a pause is shortened by, in ``[0, 1)``.
    :param random: returns values in ``[0, 1)``; injectable for tests.
    """

    __slots__ = ("_nominal", "initial", "jitter", "maximum", "random")

    def __init__(
        self,
        *,
        initial: float = 0.05,
        maximum: float = 5.0,
        jitter: float = 0.5,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"need 0 < initial <= maximum, got {initial!r} and {maximum!r}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self.random = random
        self._nominal = 0.0

    def __repr__(self) -> str:
        return (
            f"Backoff(initial={self.initial!r}, maximum={self.maximum!r}, jitter={self.jitter!r})"
        )

    def next(self) -> float:
        """Seconds to wait after one more failure."""
        self._nominal = min(self.maximum, 2 * self._nominal if self._nominal else self.initial)
        if not self.jitter:
            return self._nominal
        return self._nominal * (1.0 - self.jitter * min(1.0, max(0.0, self.random())))

    def reset(self) -> None:
        """The operation succeeded: the next failure waits ``initial`` again."""
        self._nominal = 0.0
