"""What every scenario is given: the database, PostgreSQL's CPU clock, the shared
receiver, the settings and the progress log."""

from __future__ import annotations

from collections.abc import Callable

from dispatchers.bench import Settings
from dispatchers.bench.env import postgres_clock
from dispatchers.bench.receiver_process import ReceiverProcess
from dispatchers.embedded import Database


class Bench:
    """What the scenarios share: the database, PostgreSQL's CPU clock, one receiver
    (started on first use, on a port per destination; :meth:`close` always ends
    it) and the progress log."""

    def __init__(self, db: Database, settings: Settings, progress: Callable[[str], None]) -> None:
        self.db = db
        self.settings = settings
        self.progress = progress
        self.pg_clock = postgres_clock(db.url)
        self._receiver: ReceiverProcess | None = None

    @property
    def receiver(self) -> ReceiverProcess:
        if self._receiver is None:
            receiver = ReceiverProcess(ports=self.settings.destinations)
            try:
                receiver.start()
            except BaseException:
                receiver.kill()
                raise
            self._receiver = receiver
        return self._receiver

    def close(self) -> None:
        if self._receiver is not None:
            self._receiver.kill()
            self._receiver = None
