"""Who waits for an advisory lock: ``pg_locks`` sampled through the traffic.

Writing a message with an ordering key takes a transaction-scoped advisory lock
on the key, and a second writer of the key waits for it (an ``advisory`` lock
not granted, docs/explanation/delivery-contract.md). Every :data:`INTERVAL` a
thread of the harness reads the locks not granted in the run's database, with the
waiting sessions' names; a sample in which someone waits is kept as a
:class:`~tests.history.history.LockWait` per lock. A failed sample (the database
restarting) is skipped.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import psycopg

from tests.history.history import LockWait

INTERVAL = 0.05
WAITING = """
SELECT l.classid, l.objid, a.application_name
FROM pg_locks AS l
JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND NOT l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


class LockSampler(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(name="history-lock-sampler", daemon=True)
        self.url = url
        self.samples: list[LockWait] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self.stopping.wait(INTERVAL):
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(
                            self.url,
                            autocommit=True,
                            connect_timeout=2,
                            application_name="history-locks",
                        )
                    rows = conn.execute(WAITING).fetchall()
                except psycopg.Error:
                    if conn is not None:
                        conn.close()
                    conn = None
                    continue
                at = time.time()
                waiting: dict[str, list[str]] = defaultdict(list)
                for classid, objid, app in rows:
                    waiting[f"{classid}:{objid}"].append(str(app))
                self.samples += [LockWait(at, k, tuple(sorted(v))) for k, v in waiting.items()]
        finally:
            if conn is not None:
                conn.close()

    def stop(self) -> list[LockWait]:
        """Stop sampling; the samples kept."""
        self.stopping.set()
        self.join(10)
        return list(self.samples)
