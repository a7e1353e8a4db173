"""A deduping receiver that misbehaves on purpose, run as its own process.

``python -m tests.faults.chaos_receiver --database-url URL --log PATH --ready PATH``

It serves HTTP on 127.0.0.1 (an ephemeral port, written to ``--ready`` once it
listens) and applies each request's effect the way a correct receiver does: in one
transaction with ``outbox.receiver.Inbox.claim`` of the request's Idempotency-Key,
so a redelivered key is counted as a duplicate and never applied twice. The
effects table has no unique constraint on purpose: only the inbox dedupes.

For a seeded fraction of requests (at most ``--max-faults`` per key, so every
message eventually gets through) it instead answers 500, answers 429 with
``Retry-After: 1``, sleeps past the dispatcher's request timeout, or resets the
connection (SO_LINGER 0). Except for 429, the fault comes either before the
effect (nothing applied) or after it (applied, but the dispatcher sees a
failure and must deliver again). Keys starting with ``poison-`` always get 422:
the only messages the receiver makes dead.

Every request that reached a decision is appended to the ``--log`` file as one
JSON line: ``{"key", "t", "outcome", "status", "fault"}``, where ``outcome`` is
``applied`` (this request committed the key's effect), ``duplicate`` (the inbox
had the key: nothing applied), ``rejected`` (nothing applied) or ``ambiguous``
(the commit of a first claim failed, so it may or may not have happened). A line is
written only after its transaction ended. SIGTERM stops accepting, waits
(bounded) for the requests being handled, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO

import psycopg
import psycopg_pool
from psycopg import sql

from outbox.receiver import Inbox, idempotency_key
from tests.receiver import Received, Receiver, Reply

FAULTS = ("500", "429", "slow", "reset")


class ChaosResponder:
    def __init__(
        self,
        pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[object, ...]]],
        inbox: Inbox,
        schema: str,
        log: IO[str],
        *,
        seed: int,
        fault_rate: float,
        max_faults: int,
        slow: float,
    ) -> None:
        self.pool = pool
        self.inbox = inbox
        self.insert = sql.SQL("INSERT INTO {} (key) VALUES (%s)").format(
            sql.Identifier(schema, "effects")
        )
        self.log = log
        self.seed = seed
        self.fault_rate = fault_rate
        self.max_faults = max_faults
        self.slow = slow
        self.lock = threading.Lock()
        self.seen: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.active = 0
        self.idle = threading.Condition(self.lock)

    def __call__(self, req: Received) -> Reply:
        with self.lock:
            self.active += 1
        try:
            return self.respond(req)
        finally:
            with self.idle:
                self.active -= 1
                self.idle.notify_all()

    def respond(self, req: Received) -> Reply:
        key = idempotency_key(req.headers)
        if key is None:
            self.record("", "rejected", 400, None)
            return Reply(status=400, body=b"no Idempotency-Key")
        if key.startswith("poison-"):
            self.record(key, "rejected", 422, "poison")
            return Reply(status=422, body=b"poison")
        with self.lock:
            ordinal = self.seen[key]
            self.seen[key] += 1
            # seeded per (key, arrival ordinal), so a run's faults do not depend
            # on how the requests of different keys interleave
            rng = random.Random(f"{self.seed}:{key}:{ordinal}")
            fault = None
            if self.faults[key] < self.max_faults and rng.random() < self.fault_rate:
                fault = rng.choice(FAULTS)
                self.faults[key] += 1
        apply_first = fault != "429" and rng.random() < 0.5
        if fault is None:
            outcome = self.apply(key)
            if outcome in ("applied", "duplicate"):
                self.record(key, outcome, 200, None)
                return Reply(status=200)
            self.record(key, outcome, 503, "db_down")
            return Reply(status=503, body=b"database unavailable")
        outcome = "rejected"
        if apply_first:
            outcome = self.apply(key)
        if fault == "500":
            self.record(key, outcome, 500, "500")
            return Reply(status=500, body=b"chaos")
        if fault == "429":
            self.record(key, outcome, 429, "429")
            return Reply(status=429, headers={"Retry-After": "1"}, body=b"slow down")
        if fault == "reset":
            self.record(key, outcome, None, "reset")
            return Reply(reset=True)
        # slow: past the dispatcher's request timeout, effect before or after the
        # sleep; the answer, should it still be read, is the truth (200 only if the
        # effect is in)
        if apply_first:
            status = 200 if outcome in ("applied", "duplicate") else 503
            self.record(key, outcome, status, "slow")
            return Reply(status=status, delay=self.slow)
        time.sleep(self.slow)
        outcome = self.apply(key)
        status = 200 if outcome in ("applied", "duplicate") else 503
        self.record(key, outcome, status, "slow")
        return Reply(status=status)

    def apply(self, key: str) -> str:
        """Claim ``key`` and apply its effect in one transaction."""
        first = False
        committing = False
        try:
            with self.pool.connection() as conn:
                with conn.transaction():
                    first = self.inbox.claim(conn, key)
                    if first:
                        conn.execute(self.insert, (key,))
                    committing = True
                return "applied" if first else "duplicate"
        except (psycopg.Error, psycopg_pool.PoolTimeout):
            return "ambiguous" if committing and first else "rejected"

    def record(self, key: str, outcome: str, status: int | None, fault: str | None) -> None:
        line = json.dumps(
            {"key": key, "t": time.time(), "outcome": outcome, "status": status, "fault": fault}
        )
        with self.lock:
            self.log.write(line + "\n")
            self.log.flush()

    def wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.idle:
            while self.active and time.monotonic() < deadline:
                self.idle.wait(deadline - time.monotonic())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chaos_receiver")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--schema", default="chaos_inbox")
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fault-rate", type=float, default=0.15)
    parser.add_argument("--max-faults", type=int, default=3)
    parser.add_argument("--slow", type=float, default=1.5)
    args = parser.parse_args(argv)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    inbox = Inbox(schema=args.schema)
    with psycopg.connect(args.database_url) as conn:
        inbox.ensure_schema(conn)
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, key text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            ).format(sql.Identifier(args.schema, "effects"))
        )
    pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[object, ...]]] = (
        psycopg_pool.ConnectionPool(
            args.database_url,
            min_size=4,
            max_size=24,
            timeout=2.0,
            kwargs={"autocommit": True, "connect_timeout": 2},
            open=True,
            name="chaos-receiver",
        )
    )
    with pool, args.log.open("a", encoding="utf-8") as log:
        responder = ChaosResponder(
            pool,
            inbox,
            args.schema,
            log,
            seed=args.seed,
            fault_rate=args.fault_rate,
            max_faults=args.max_faults,
            slow=args.slow,
        )
        with Receiver(responder) as receiver:
            partial = args.ready.with_suffix(".partial")
            partial.write_text(receiver.url, encoding="utf-8")
            partial.rename(args.ready)
            signal.sigwait({signal.SIGTERM, signal.SIGINT})
            receiver.server.shutdown()  # no new connections handled
            responder.wait_idle(10.0)
        responder.wait_idle(10.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
