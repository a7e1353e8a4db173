"""When to claim next: the claim cadence of one dispatcher, without I/O.

A claim costs PostgreSQL about the same whether it takes one message or twenty,
so at a steady load the dispatcher should claim a few messages at a time, and
when nothing arrives it should not claim at all. Three ways of waiting:

- **backlog**: the last claim took all it asked for; claim again at once.
- **busy**: messages keep arriving faster than one per ``window``; claim on a
  timer, once per ``window`` (so each claim takes what arrived meanwhile), and no
  notification is needed: the wake lock is released, so producers send none
  (see :mod:`dispatchers.runtime.waker`). Claims that find nothing stretch the timer
  (``window`` doubled per empty claim, up to ``poll_interval``).
- **idle**: messages are rare; wait for a notification (the dispatcher holds the
  wake lock, so every producer notifies), but claim at most once per ``window``,
  so a burst of notifications becomes one claim; poll every ``poll_interval``
  anyway (retries falling due are announced by nobody).

A dispatcher that is not on duty (another one is; see :mod:`dispatchers.runtime.waker`)
polls every ``poll_interval``, so one notification never wakes every dispatcher.

Whatever the mode, a claim that a destination's rate limit held back says when
that destination's next rate slot frees (``rate_wait``), and the dispatcher
claims again then, at the latest: nobody announces a freed slot.

The arrival rate is estimated from what the claims take (an exponentially
decaying count over ``horizon`` seconds); the dispatcher wants to be busy above
one message per ``window`` and idle below half that, so the mode does not flap.
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
