"""When to claim next: the claim cadence of one dispatcher, without I/O.

Three modes: **backlog** (claim again at once), **busy** (claim once per
``window``, wake lock released) and **idle** (wait for a notification, at most
one claim per ``window``, poll every ``poll_interval``). A dispatcher not on duty
polls. A claim held back by a rate limit says when to claim again
(``rate_wait``). The mode follows a decaying arrival rate, with hysteresis.

Design: docs/explanation/design/cadence.md
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MIN_TIMER = 0.001
"""Shortest timer between two claims, whatever the window (0 included)."""

EMPTY_STREAK_IDLE = 2
"""Claims in a row that find nothing before a busy dispatcher wants to be idle,
whatever the rate estimate says."""


@dataclass
class Cadence:
    """The claim cadence of one dispatcher (times from a monotonic clock, seconds).

    :param window: shortest time between two claims while messages trickle in
        (0: claim on every notification, never on a timer unless needed).
    :param poll_interval: longest time between two claims.
    :param horizon: how far back the arrival rate estimate looks.
    """

    window: float
    poll_interval: float
    horizon: float = 0.5
    rate: float = 0.0
    busy: bool = False
    empty_streak: int = 0
    last_claim: float = field(default=-math.inf)
    backlog: bool = False
    rate_wait: float | None = None

    def claimed(
        self, count: int, wanted: int, now: float, *, rate_wait: float | None = None
    ) -> None:
        """Record a claim, sent at ``now``, that took ``count`` of ``wanted``, and
        after which a rate slot frees in ``rate_wait`` seconds (if one held
        messages back)."""
        self.rate_wait = rate_wait
        if self.last_claim > -math.inf:
            self.rate *= math.exp(-(now - self.last_claim) / self.horizon)
        self.rate += count / self.horizon
        self.last_claim = now
        self.backlog = count >= wanted
        self.empty_streak = 0 if count else self.empty_streak + 1
        if not self.window:
            self.busy = False  # no window: every notification is claimed at once
        elif self.busy:
            self.busy = self.rate * self.window >= 0.5 and self.empty_streak < EMPTY_STREAK_IDLE
        else:
            self.busy = self.rate * self.window > 1.0

    def next_claim(self, *, on_duty: bool, notified: bool) -> float:
        """When to claim next if no notification comes. ``on_duty``: this dispatcher
        is the one that claims promptly; ``notified``: it holds the wake lock, so
        producers notify it of every new message."""
        if self.backlog:
            return self.last_claim
        if notified or not on_duty:
            wait = self.poll_interval
        else:
            # On duty without notifications (busy, or not yet holding the wake
            # lock): only this timer finds new messages.
            stretch = math.ldexp(max(self.window, MIN_TIMER), min(self.empty_streak, 16))
            wait = min(self.poll_interval, stretch)
        if self.rate_wait is not None:
            wait = min(wait, max(self.rate_wait, MIN_TIMER))
        return self.last_claim + wait

    def earliest_claim(self) -> float:
        """The soonest a notification may make the dispatcher claim: notifications
        within ``window`` of the last claim are gathered into one claim."""
        return self.last_claim if self.backlog else self.last_claim + self.window
