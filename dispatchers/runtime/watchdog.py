"""When a dispatcher stops instead of trying again.

A permanent error that persists for ``patience`` seconds in one operation (each
counts its own), or a drain without progress for ``stall`` seconds, ends the
dispatcher: :class:`Watchdog` hands the error to ``on_failure`` and the
dispatcher stops through its usual shutdown and raises it. It reads a clock and
decides; it never waits.

Design: docs/explanation/design/watchdog.md
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dispatchers.errors import DatabaseUnusable, DispatcherFailed, DrainStalled
from dispatchers.store.sqlstates import Kind, classify, describe


class Watchdog:
    """Decides, from the database's answers and errors, when a dispatcher stops.

    :param patience: seconds an operation may meet only permanent errors.
    :param stall: seconds a drain may go without progress.
    :param on_failure: called once, with the error that ends the dispatcher.
    :param clock: monotonic seconds; injectable for tests.
    """

    def __init__(
        self,
        *,
        patience: float,
        stall: float,
        on_failure: Callable[[DispatcherFailed], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.patience = patience
        self.stall = stall
        self._on_failure = on_failure
        self._clock = clock
        # operation -> its error since its last answer, the latest last
        self._errors: dict[str, BaseException] = {}
        self._failing_since: dict[str, float] = {}  # operation -> first permanent error
        self._progress_at = clock()
        self.failure: DispatcherFailed | None = None

    @property
    def last_error(self) -> BaseException | None:
        """The latest error of an operation that has not been answered since."""
        return next(reversed(self._errors.values()), None)

    def answered(self, operation: str) -> None:
        """``operation`` got an answer: its count of permanent errors starts over."""
        self._errors.pop(operation, None)
        self._failing_since.pop(operation, None)

    def failed(self, operation: str, exc: BaseException) -> None:
        """``operation`` met ``exc``; past ``patience`` of permanent errors, fail."""
        self._errors.pop(operation, None)
        self._errors[operation] = exc
        if classify(exc) is Kind.TRANSIENT:
            return
        now = self._clock()
        since = self._failing_since.setdefault(operation, now)
        if now - since >= self.patience:
            self._fail(
                DatabaseUnusable(
                    f"{operation} met a permanent database error for {now - since:.0f} s: "
                    f"{describe(exc)}"
                )
            )

    def progressed(self) -> None:
        """Something was claimed, recorded or rescued, or the work left changed."""
        self._progress_at = self._clock()

    def check_stall(self) -> None:
        """For a drain: fail once ``stall`` seconds have passed without progress."""
        idle = self._clock() - self._progress_at
        if idle < self.stall:
            return
        error = self.last_error
        cause = f"; last database error: {describe(error)}" if error is not None else ""
        self._fail(
            DrainStalled(
                f"the drain made no progress for {idle:.0f} s (--drain-timeout "
                f"{self.stall:g}){cause}"
            )
        )

    def check_interrupted(self) -> None:
        """A drain was stopped before it finished: fail if the database was failing
        then, so that its exit does not pass for a drain that succeeded."""
        error = self.last_error
        if error is not None:
            self._fail(
                DatabaseUnusable(
                    "stopped before the drain finished, while the database was failing: "
                    f"{describe(error)}"
                )
            )

    def _fail(self, failure: DispatcherFailed) -> None:
        if self.failure is None:
            self.failure = failure
            self._on_failure(failure)
