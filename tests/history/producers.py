"""Producers: threads with their own connections, playing their planned
transactions and recording what became of each.

A transaction reads its own xid first (``pg_current_xact_id()``), so that a commit
whose answer was lost (the database restarting under it) can be resolved later
by ``pg_xact_status``. Each records the time just before COMMIT was sent and just
after it returned. An error inside a transaction (a deadlock between two
producers' ordering-key locks, a lost connection) rolls it back, and is recorded
as such: that is part of the workload, not a failure of the run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import psycopg

from outbox import Outbox, OutboxError
from tests.history.history import Txn, Write
from tests.history.workload import Op, TxnPlan

CONNECT_TIMEOUT = 3
RECONNECT_FOR = 30.0
"""Seconds a producer keeps trying to connect (the database may be restarting)."""


class Producer(threading.Thread):
    def __init__(
        self, number: int, url: str, plans: tuple[TxnPlan, ...], targets: Mapping[str, str]
    ) -> None:
        super().__init__(name=f"history-producer-{number}", daemon=True)
        self.number = number
        self.url = url
        self.plans = plans
        self.targets = targets  # plain destination name -> URL
        self.box = Outbox()
        self.stopping = threading.Event()
        self.txns: list[Txn] = []
        self.error: BaseException | None = None
        self.conn: psycopg.Connection[Any] | None = None

    def run(self) -> None:
        try:
            for i, p in enumerate(self.plans):
                if self.stopping.wait(p.pause):
                    break
                self.txns.append(self.play(i, p))
        except BaseException as exc:  # reported by the harness
            self.error = exc
        finally:
            if self.conn is not None:
                self.conn.close()

    def stop(self, timeout: float) -> None:
        self.stopping.set()
        self.join(timeout)

    def _connect(self) -> psycopg.Connection[Any]:
        if self.conn is not None and not self.conn.closed:
            return self.conn
        deadline = time.monotonic() + RECONNECT_FOR
        while True:
            try:
                self.conn = psycopg.connect(
                    self.url,
                    connect_timeout=CONNECT_TIMEOUT,
                    application_name=f"producer-{self.number}",
                )
                return self.conn
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.stopping.is_set():
                    raise
                self.stopping.wait(0.2)

    def play(self, number: int, p: TxnPlan) -> Txn:
        """Play one planned transaction on this thread's connection; what became of it."""
        conn = self._connect()
        began = time.time()
        writes: list[Write] = []
        xid: int | None = None
        sent: float | None = None
        try:
            row = conn.execute("SELECT CAST(pg_current_xact_id() AS text)").fetchone()
            xid = int(row[0]) if row else None
            for op in p.ops:
                writes.append(self._write(conn, op))
            self.stopping.wait(p.hold)
            if not p.commit:
                conn.rollback()
                return Txn(
                    self.number, number, xid, "rollback", False, began, None, None, tuple(writes)
                )
            sent = time.time()
            conn.commit()
            return Txn(
                self.number, number, xid, "commit", True, began, sent, time.time(), tuple(writes)
            )
        except (psycopg.Error, OutboxError) as exc:
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if conn.closed or conn.broken:
                self.conn = None
            else:
                try:
                    conn.rollback()
                except psycopg.Error:
                    self.conn = None
            # a commit that raised may have happened: resolved from its xid later
            committed = None if sent is not None else False
            intended = "commit" if p.commit else "rollback"
            return Txn(
                self.number,
                number,
                xid,
                intended,
                committed,
                began,
                sent,
                None,
                tuple(writes),
                error,
            )

    def _write(self, conn: psycopg.Connection[Any], op: Op) -> Write:
        if op.kind == "publish":
            ids = self.box.publish(
                conn,
                op.destination,
                {"event": op.key},
                idempotency_key=op.key,
                ordering_key=op.ordering_key,
            )
            return Write("publish", op.destination, op.key, op.ordering_key, tuple(ids))
        mid = self.box.enqueue(
            conn,
            url=self.targets[op.destination],
            idempotency_key=op.key,
            json={"key": op.key},
            ordering_key=op.ordering_key,
            max_attempts=op.max_attempts,
        )
        return Write("enqueue", op.destination, op.key, op.ordering_key, (mid,))


def resolve(url: str, txns: list[Txn]) -> list[Txn]:
    """Each transaction whose commit raised, resolved by ``pg_xact_status`` of its
    xid: committed, aborted, or (None) still unknown."""
    pending = [t for t in txns if t.committed is None and t.xid is not None]
    if not pending:
        return txns
    with psycopg.connect(url, application_name="history-harness") as conn:
        status = {
            t.xid: conn.execute("SELECT pg_xact_status(CAST(%s AS xid8))", (str(t.xid),)).fetchone()
            for t in pending
        }
    out = []
    for t in txns:
        if t in pending:
            row = status.get(t.xid)
            verdict = None if row is None else {"committed": True, "aborted": False}.get(row[0])
            t = Txn(
                t.producer,
                t.number,
                t.xid,
                t.intended,
                verdict,
                t.began,
                t.commit_sent,
                t.commit_returned,
                t.writes,
                t.error,
            )
        out.append(t)
    return out
