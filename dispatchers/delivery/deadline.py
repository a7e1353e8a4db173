"""One timer bounds every HTTP attempt in flight.

Every attempt of a sender has the same ``request_timeout``, so deadlines arrive in
the order attempts start: :class:`Deadlines` keeps them in an insertion-ordered
dict under one loop timer, cancelled once no attempt is left. An overdue
attempt's cancellation becomes its timeout (:meth:`Deadlines.expired`), unless
someone else cancelled it too: that cancellation goes on.

Design: docs/explanation/design/deadline.md
"""

from __future__ import annotations

import asyncio
from typing import Any

SLACK = 0.001
"""Seconds early a deadline may be treated as reached: loop clocks and timers
have about millisecond resolution (uvloop's), and re-arming a timer for a
deadline a fraction of a millisecond away would only spin."""

Task = asyncio.Task[Any]


class Deadlines:
    """Cancels tasks still registered ``timeout`` seconds after :meth:`add`.

    Every task added is expected to run on one event loop.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        # task -> (deadline, its cancellation count when added); in deadline order
        self._due: dict[Task, tuple[float, int]] = {}
        # task cancelled by the timer -> its cancellation count when added
        self._overdue: dict[Task, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        """Tasks bounded now (registered, or cancelled by the timer and not yet
        discarded)."""
        return len(self._due) + len(self._overdue)

    @property
    def armed(self) -> bool:
        """A timer is scheduled (only while some task is registered)."""
        return self._timer is not None

    def add(self, task: Task) -> None:
        """Bound ``task`` by the timeout from now, until :meth:`discard`."""
        loop = task.get_loop()
        deadline = loop.time() + self.timeout
        self._due.pop(task, None)  # re-added: moves to the end, keeping deadline order
        self._due[task] = (deadline, task.cancelling())
        if self._timer is None:
            self._loop = loop
            self._timer = loop.call_at(deadline, self._sweep)

    def discard(self, task: Task) -> None:
        """Stop bounding ``task`` (it finished, in time or not). Idempotent."""
        self._due.pop(task, None)
        self._overdue.pop(task, None)
        if not self._due and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def expired(self, task: Task) -> bool:
        """Whether the CancelledError ``task`` is handling is this timeout's alone.

        If so, the cancellation is withdrawn (``task.uncancel()``) and the caller
        treats the attempt as timed out; if not (never overdue, or cancelled by
        someone else too), the caller lets the CancelledError propagate.
        """
        before = self._overdue.pop(task, None)
        if before is None:
            return False
        return task.uncancel() <= before

    def _sweep(self) -> None:
        """Cancel every overdue task, then arm the timer for the next deadline."""
        self._timer = None
        loop = self._loop
        if loop is None:  # pragma: no cover - armed only by add(), which sets it
            return
        now = loop.time() + SLACK
        while self._due:
            task, (deadline, before) = next(iter(self._due.items()))
            if deadline > now:
                self._timer = loop.call_at(deadline, self._sweep)
                return
            del self._due[task]
            if not task.done():
                self._overdue[task] = before
                task.cancel()
