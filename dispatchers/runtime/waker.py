"""Wake-ups: which dispatcher claims promptly, and when producers notify it.

One session connection per dispatcher holds two advisory locks and ``LISTEN``: the
**duty lock** (its holder listens and claims at once; the others poll and queue
for it) and the **wake lock** (held while the dispatcher on duty is idle; an
enqueue notifies only when it cannot take it shared). No message is missed: a
producer holds the lock shared until its commit is visible. Lock keys are the
schema's.

Design: docs/explanation/design/waker.md
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from dispatchers.runtime.backoff import Backoff
from dispatchers.runtime.config import DispatcherConfig
from dispatchers.runtime.log import EventLog
from dispatchers.store.session import Session, duty_lock_key, wake_lock_key


class Waker:
    """The session connection of one dispatcher: duty, the wake lock and LISTEN.

    ``want_wake`` (set by the claim loop) says whether the dispatcher wants to be
    notified; :meth:`run` brings the locks in line with it and calls
    ``on_change`` whenever ``on_duty`` or ``notified`` changes, and
    ``on_notify`` for each notification.
    """

    def __init__(
        self,
        conninfo: str,
        config: DispatcherConfig,
        *,
        on_notify: Callable[[], None],
        on_change: Callable[[], None],
        log: EventLog,
    ) -> None:
        self.conninfo = conninfo
        self.config = config
        self.log = log
        self._on_notify = on_notify
        self._on_change = on_change
        self._duty = duty_lock_key(config.schema)
        self._wake = wake_lock_key(config.schema)
        self.on_duty = False
        self.notified = False  # holds the wake lock: producers notify us
        self.want_wake = False
        self.want_duty = True
        self.notifications = 0  # received, for benchmarks and tests
        self._round_trips = 0  # statements sent on sessions closed since
        self._session: Session | None = None
        self._changed = asyncio.Event()

    def request(self, *, wake: bool | None = None, duty: bool | None = None) -> None:
        """Ask to hold the wake lock (be notified) or to release it; to take duty
        (when it is free) or to hand it off."""
        if wake is not None and wake != self.want_wake:
            self.want_wake = wake
            self._changed.set()
        if duty is not None and duty != self.want_duty:
            self.want_duty = duty
            self._changed.set()

    async def run(self) -> None:
        """Hold duty when it is free and the wake lock as requested, until cancelled;
        reconnect after errors (locks die with the session, so nothing is stuck)."""
        backoff = Backoff(initial=0.5, maximum=2.0)
        while True:
            try:
                session = await Session.connect(
                    self.conninfo,
                    self.config.schema,
                    connect_timeout=self.config.db_connect_timeout,
                    on_notify=self._notified,
                )
                async with session:
                    self._session = session
                    await self._serve(session)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.log.event("listen_error", error=type(exc).__name__)
            finally:
                if self._session is not None:
                    self._round_trips += self._session.round_trips
                    self._session = None
                self._set(on_duty=False, notified=False)
            await asyncio.sleep(backoff.next())

    @property
    def round_trips(self) -> int:
        """Statements sent so far, on every session."""
        return self._round_trips + (self._session.round_trips if self._session else 0)

    async def _serve(self, session: Session) -> None:
        # The one lock wait here (for duty) is bounded by lock_timeout; every
        # statement by statement_timeout; and the server notices a vanished
        # dispatcher (its locks are then freed) by TCP keepalives.
        poll = self.config.poll_interval
        await session.configure(
            lock_timeout=poll, statement_timeout=poll + self.config.statement_timeout
        )
        while True:
            if not self.on_duty and self.want_duty and await session.lock(self._duty):
                # Listen before the wake lock can be taken: a producer that sees it
                # held notifies at once, and that notification must not be lost.
                await session.listen()
                self._set(on_duty=True, notified=False)
            if self.on_duty and not self.want_duty:
                # Hand off: the next dispatcher queued for duty takes it at once.
                await session.unlisten()
                await session.unlock_all()
                self._set(on_duty=False, notified=False)
            if self.on_duty:
                if self.want_wake and not self.notified:
                    if await session.try_lock(self._wake):
                        self._set(on_duty=True, notified=True)
                elif not self.want_wake and self.notified:
                    await session.unlock(self._wake)
                    self._set(on_duty=True, notified=False)
            if not self.on_duty:
                if not self.want_duty:
                    await self._wait(session, None)
                # else: queue for duty again at once (the wait is in session.lock)
            elif self.want_wake == self.notified:
                await self._wait(session, None)
            else:
                # On duty but not yet holding the wake lock (a producer holds it
                # shared until its commit): try again soon.
                await self._wait(session, self.config.claim_window)

    async def _wait(self, session: Session, seconds: float | None) -> None:
        """Wait for a notification, a request or ``seconds``, with nothing sent.
        Notifications that arrive while a statement runs reach ``on_notify``
        through the session too."""
        self._changed.clear()
        await session.wait(self._changed, seconds)

    def _notified(self) -> None:
        self.notifications += 1
        self._on_notify()

    def _set(self, *, on_duty: bool, notified: bool) -> None:
        if (on_duty, notified) != (self.on_duty, self.notified):
            self.on_duty, self.notified = on_duty, notified
            self._on_change()
