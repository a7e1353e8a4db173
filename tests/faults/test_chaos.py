"""Chaos: real ``outbox dispatch`` processes deliver a stream of messages to a
misbehaving, deduping receiver while one dispatcher is killed, another is frozen
past its lease, and PostgreSQL is restarted; then every invariant of the contract
is checked:

- no message lost: each is delivered (in ``outbox.delivered``) or, only where
  the receiver answered 422, dead;
- one effect per key at the receiver: the effects table (no unique constraint;
  only ``Inbox.claim`` dedupes) holds each key exactly once, while the raw
  request log shows the duplicates that reached it, each one deduped;
- no write by a fenced-out owner: each message's attempt rows are exactly
  ``1..attempts``, each written by the owner that claimed that attempt, the
  last one the final outcome; the killed and the frozen owners' lost attempts
  are ``lease_expired`` rows, and the frozen one, once thawed, changed nothing;
- the dispatchers that were not killed exit 0 on SIGTERM.

Receiver (``tests/faults/chaos_receiver.py``, its own process): answers a seeded
15 % of requests (at most three per key) with 500, 429 + ``Retry-After: 1``, a
sleep past the request timeout, or a connection reset, before or after applying
the effect.

Budgets (``dispatchers/runtime/config.py``): lease 6 s >= 1.5 x (request 1 s + flush
0.05 s + statement 1.5 s), and the claim and statement timeouts (1.5 s) are at
most a third of it. Retries start at 0.2 s and are capped at 2 s (a 429 waits its
``Retry-After`` of 1 s), so the 50 attempts each message has are never spent.
Every wait has a deadline, every process is killed when the test ends, and all
traffic goes to 127.0.0.1.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from outbox import Outbox
from tests.conftest import PgServer
from tests.processes import DispatcherProcess, Fleet, query, scalar, sessions, wait_until

REPO = Path(__file__).resolve().parents[2]
SEED = 20240611
TOTAL = 5000
POISON_EVERY = 97  # every 97th key is answered 422: dead, by the receiver's choice
MAX_ATTEMPTS = 50
LEASE = 6.0
BUDGET = 200.0  # seconds for the whole run, from the first enqueue to the last check
DISPATCH_ARGS = (
    "--lease",
    "6",
    "--request-timeout",
    "1",
    "--connect-timeout",
    "0.5",
    "--statement-timeout",
    "1.5",
    "--claim-timeout",
    "1.5",
    "--retry-base",
    "0.2",
    "--retry-cap",
    "2",
    "--grace",
    "2",
    "--concurrency",
    "16",
    # the receiver answers a random few percent of requests 429 with Retry-After:
    # held whole, its one destination would wait most of the run; what this
    # test checks (leases, rescue, dedupe) needs every message through in time
    "--no-retry-after-holds",
    # while PostgreSQL restarts, the receiver (whose inbox is there) answers 503:
    # the breaker opens, as it should, and its probes meet the outage too; at the
    # default back-off (5 s, doubling to 40 s after three failed probes) the
    # destination could stay shut past the time this test waits for deliveries
    "--breaker-backoff",
    "1",
    "--breaker-backoff-max",
    "2",
    "--log-level",
    "debug",  # "claimed" events: who claimed which attempt
)
INBOX = "chaos_inbox"


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def left(self, cap: float) -> float:
        """At most ``cap`` seconds, and never past the deadline (at least 1 s)."""
        return max(1.0, min(cap, self.at - time.monotonic()))


# -- the receiver process ----------------------------------------------------------


class ChaosReceiver:
    """``tests/faults/chaos_receiver.py`` as a subprocess, killed at the end whatever happens."""

    def __init__(self, database_url: str, workdir: Path, *, seed: int) -> None:
        self.log_path = workdir / "receiver-requests.jsonl"
        self.ready_path = workdir / "receiver.url"
        self.stderr_path = workdir / "receiver.stderr"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("OUTBOX_DATABASE_URL", "DATABASE_URL", "OUTBOX_EMBEDDED_DIR")
        }
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        argv = [
            sys.executable,
            "-m",
            "tests.faults.chaos_receiver",
            "--database-url",
            database_url,
            "--schema",
            INBOX,
            "--log",
            str(self.log_path),
            "--ready",
            str(self.ready_path),
            "--seed",
            str(seed),
            "--fault-rate",
            "0.15",
            "--max-faults",
            "3",
            "--slow",
            "1.5",
        ]
        with open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd=workdir, env=env
            )
        try:
            self.url: str = wait_until(
                self._ready, timeout=30, what="the chaos receiver to listen", interval=0.05
            )
        except BaseException:
            self.kill()
            raise

    def _ready(self) -> str | None:
        if self.popen.poll() is not None:
            raise AssertionError(f"the chaos receiver exited: {self.stderr()}")
        return self.ready_path.read_text(encoding="utf-8") if self.ready_path.exists() else None

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-3000:]

    def stop(self) -> int:
        """SIGTERM: it finishes the requests in hand, then exits."""
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the chaos receiver did not stop: {self.stderr()}") from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def requests(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines]


# -- the application: enqueues while everything else happens -------------------------


class Producer(threading.Thread):
    """Enqueues ``keys`` in small transactions at a steady pace, waiting at each
    gate (a count of keys) until its event is set, so that traffic spans every
    fault, however long each takes. A batch that met a database error is
    enqueued again: same key and target, same message, so a commit that was lost
    or not is never doubled."""

    def __init__(
        self,
        url: str,
        target: str,
        keys: Sequence[str],
        *,
        first: int,
        batch: int,
        pause: float,
        gates: Sequence[tuple[int, threading.Event]],
        deadline: Deadline,
    ) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.url = url
        self.target = target
        self.keys = keys
        self.first = first
        self.batch = batch
        self.pause = pause
        self.gates = gates
        self.deadline = deadline
        self.stopping = threading.Event()
        self.ids: dict[str, int] = {}
        self.retries = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._enqueue(self.keys[: self.first])
            start = self.first
            while start < len(self.keys) and not self.stopping.is_set():
                for at, gate in self.gates:
                    if start >= at:
                        gate.wait(self.deadline.left(120))
                self._enqueue(self.keys[start : start + self.batch])
                start += self.batch
                self.stopping.wait(self.pause)
        except BaseException as exc:
            self.error = exc

    def _enqueue(self, keys: Sequence[str]) -> None:
        box = Outbox()
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn, conn.transaction():
                    ids = [
                        box.enqueue(
                            conn,
                            url=self.target,
                            idempotency_key=key,
                            json={"key": key},
                            max_attempts=MAX_ATTEMPTS,
                        )
                        for key in keys
                    ]
                self.ids.update(zip(keys, ids, strict=True))
                return
            except psycopg.OperationalError:
                if self.stopping.is_set() or time.monotonic() > self.deadline.at:
                    raise
                self.retries += 1
                time.sleep(0.2)

    def stop(self) -> None:
        self.stopping.set()
        for _, gate in self.gates:
            gate.set()
        self.join(30)


# -- reading the evidence ------------------------------------------------------------


def held_by(url: str, process: DispatcherProcess) -> dict[int, int]:
    """{message id: attempt} of the rows ``process`` holds a lease on."""
    rows = query(
        url,
        "SELECT id, attempts FROM outbox.messages"
        " WHERE state = 'running' AND starts_with(lease_owner, %s)",
        (process.owner_prefix,),
    )
    return {mid: attempt for mid, attempt in rows}


def still_leases(url: str, process: DispatcherProcess) -> tuple[dict[int, int]] | None:
    """The leases a stopped ``process`` holds, once the server has finished every
    statement it sent: none of its sessions is active, and none changed while the
    leases were read. None while a statement still runs."""
    before = sessions(url, process)
    if any(state == "active" for state, _ in before):
        return None
    held = held_by(url, process)
    return (held,) if sessions(url, process) == before else None


def freeze_holding(
    url: str, process: DispatcherProcess, deadline: Deadline, procs: Sequence[DispatcherProcess]
) -> dict[int, int]:
    """SIGSTOP ``process`` at a moment it holds leases, and return them once the server
    has finished every statement it had sent. A completion already on the wire when the
    signal lands may release every lease it held; then it is thawed and tried again."""
    for _ in range(10):
        wait_until(
            lambda: len(held_by(url, process)) >= 3,
            timeout=deadline.left(30),
            what=f"{process.name} to hold leases",
            processes=procs,
        )
        assert sessions(url, process), f"{process.name}'s sessions are not named"
        process.signal(signal.SIGSTOP)
        (held,) = wait_until(
            lambda: still_leases(url, process),
            timeout=deadline.left(30),
            what=f"the frozen {process.name}'s statements to finish",
            processes=procs,
        )
        if held:
            return held
        process.signal(signal.SIGCONT)
    raise AssertionError(f"{process.name} held no lease in ten tries at freezing it")


def lease_expired_rows(url: str, process: DispatcherProcess) -> set[tuple[int, int]]:
    rows = query(
        url,
        "SELECT message_id, attempt FROM outbox.attempts"
        " WHERE outcome = 'lease_expired' AND starts_with(owner, %s)",
        (process.owner_prefix,),
    )
    return {(mid, attempt) for mid, attempt in rows}


def events(process: DispatcherProcess, *, killed: bool = False) -> list[dict[str, Any]]:
    """The process's JSON log; a SIGKILLed one may have left half a last line."""
    if not killed:
        return process.events()
    lines = process.stdout().splitlines()
    parsed: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        try:
            parsed.append(json.loads(line))
        except ValueError:
            assert number == len(lines), f"{process.name} line {number}: {line!r}"
    return parsed


@dataclass
class Chaos:
    kills: int = 0
    freezes: int = 0
    restarts: int = 0
    frozen_for: float = 0.0
    killed_rows: dict[int, int] = field(default_factory=dict)
    frozen_rows: dict[int, int] = field(default_factory=dict)


def delivered_count(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM outbox.delivered"))


def settled(url: str, total: int) -> bool:
    pending, dead = query(
        url,
        "SELECT count(*) FILTER (WHERE state <> 'dead'), count(*) FILTER (WHERE state = 'dead')"
        " FROM outbox.messages",
    )[0]
    return pending == 0 and delivered_count(url) + dead == total


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as fleet:
        yield fleet


@pytest.mark.faults
@pytest.mark.timeout(240)
def test_chaos_kill_freeze_restart_every_key_applied_once(
    pg_server: PgServer, database_url: str, fleet: Fleet, tmp_path: Path
) -> None:
    began = time.monotonic()
    deadline = Deadline(BUDGET)
    keys = [
        f"poison-{i:05d}" if i % POISON_EVERY == POISON_EVERY - 1 else f"chaos-{i:05d}"
        for i in range(TOTAL)
    ]
    poison = {k for k in keys if k.startswith("poison-")}
    chaos = Chaos()
    thawed, restarted = threading.Event(), threading.Event()

    receiver = ChaosReceiver(database_url, tmp_path, seed=SEED)
    producer: Producer | None = None
    try:
        producer = Producer(
            database_url,
            f"{receiver.url}/effect",
            keys,
            first=500,
            batch=100,
            pause=0.8,
            gates=[(int(TOTAL * 0.6), thawed), (int(TOTAL * 0.85), restarted)],
            deadline=deadline,
        )
        producer.start()
        first, second, third = (fleet.start(database_url, *DISPATCH_ARGS) for _ in range(3))
        procs = [first, second, third]

        # 1. SIGKILL a dispatcher that holds leases; a new one takes its place. It is
        # stopped first, so that the leases it dies holding are known.
        chaos.killed_rows = freeze_holding(database_url, first, deadline, procs)
        first.signal(signal.SIGKILL)
        assert first.wait(timeout=10) == -signal.SIGKILL
        chaos.kills += 1
        # Its sessions end once the server notices the closed sockets.
        wait_until(
            lambda: not sessions(database_url, first),
            timeout=deadline.left(30),
            what="the killed dispatcher's sessions to end",
            processes=procs,
        )
        fourth = fleet.start(database_url, *DISPATCH_ARGS)
        procs.append(fourth)

        # 2. SIGSTOP another one until its leases have expired and been rescued.
        chaos.frozen_rows = freeze_holding(database_url, second, deadline, procs)
        frozen_at = time.monotonic()
        try:
            chaos.freezes += 1
            wanted = set(chaos.frozen_rows.items())
            wait_until(
                lambda: wanted <= lease_expired_rows(database_url, second),
                timeout=deadline.left(45),
                what="the frozen dispatcher's leases to be rescued",
                processes=procs,
            )
            # frozen for longer than a lease, whenever the rescuers came by
            time.sleep(max(0.0, frozen_at + LEASE + 1.0 - time.monotonic()))
            chaos.frozen_for = time.monotonic() - frozen_at
        finally:
            second.signal(signal.SIGCONT)
        thawed.set()

        # 3. Stop and restart PostgreSQL under everyone's feet.
        if pg_server.restartable:
            wait_until(
                lambda: (
                    scalar(
                        database_url, "SELECT count(*) FROM outbox.messages WHERE state = 'running'"
                    )
                    >= 5
                ),
                timeout=deadline.left(30),
                what="deliveries in flight after the thaw",
                processes=procs,
            )
            try:
                pg_server.stop()
                chaos.restarts += 1
                time.sleep(3.0)  # an outage, not a wait: every dispatcher meets it (db_error)
            finally:
                pg_server.start()
            before = delivered_count(database_url)
            wait_until(
                lambda: delivered_count(database_url) >= before + 100,
                timeout=deadline.left(45),
                what="deliveries after the database restart",
                processes=procs,
            )
        restarted.set()

        # 4. Everything settles: delivered, or dead where the receiver said so.
        producer.join(deadline.left(60))
        assert not producer.is_alive(), "the producer did not finish"
        assert producer.error is None, repr(producer.error)
        wait_until(
            lambda: settled(database_url, TOTAL),
            timeout=deadline.left(120),
            what="every message to be delivered or dead",
            processes=procs,
            interval=0.5,
        )

        # 5. The dispatchers that were not killed stop cleanly.
        survivors = [second, third, fourth]
        for proc in survivors:
            proc.signal(signal.SIGTERM)
        for proc in survivors:
            assert proc.wait(timeout=30) == 0, proc.describe()
        assert receiver.stop() == 0, receiver.stderr()
    finally:
        if producer is not None:
            producer.stop()
        receiver.kill()
        fleet.kill_all()

    ids = producer.ids
    assert sorted(ids) == sorted(keys) and len(set(ids.values())) == TOTAL
    check_invariants(
        database_url,
        keys=keys,
        ids=ids,
        poison=poison,
        chaos=chaos,
        receiver=receiver,
        killed=first,
        frozen=second,
        survivors=[second, third, fourth],
        elapsed=time.monotonic() - began,
        producer_retries=producer.retries,
    )


def check_invariants(
    url: str,
    *,
    keys: list[str],
    ids: dict[str, int],
    poison: set[str],
    chaos: Chaos,
    receiver: ChaosReceiver,
    killed: DispatcherProcess,
    frozen: DispatcherProcess,
    survivors: list[DispatcherProcess],
    elapsed: float,
    producer_retries: int,
) -> None:
    key_of = {mid: key for key, mid in ids.items()}

    # -- no message lost; dead only where the receiver made it so ---------------------
    delivered = dict(query(url, "SELECT id, attempts FROM outbox.delivered"))
    left = query(url, "SELECT id, state, attempts, last_status FROM outbox.messages")
    dead = {mid: attempts for mid, state, attempts, _ in left if state == "dead"}
    assert {state for _, state, _, _ in left} <= {"dead"}, left[:20]
    assert {key_of[mid] for mid in dead} == poison
    assert {status for *_, status in left} == {422}
    assert {key_of[mid] for mid in delivered} == set(keys) - poison
    lost = len(keys) - len(delivered) - len(dead)
    assert lost == 0
    attempts_of = {**delivered, **dead}

    # -- the attempt history: 1..attempts, each by the owner that claimed it ------------
    processes = [killed, *survivors]
    owner_of: dict[str, DispatcherProcess] = {}
    claimers: dict[tuple[int, int], list[DispatcherProcess]] = collections.defaultdict(list)
    logs = {p.name: events(p, killed=p is killed) for p in processes}
    for proc in processes:
        for event in logs[proc.name]:
            if event["event"] == "claimed":
                claimers[(event["message_id"], event["attempt"])].append(proc)
    shared = {k: [p.name for p in v] for k, v in claimers.items() if len(v) > 1}
    assert not shared, f"attempts claimed by two dispatchers: {shared}"

    rows = query(
        url,
        "SELECT message_id, attempt, owner, outcome, status FROM outbox.attempts"
        " ORDER BY message_id, attempt",
    )
    history: dict[int, list[tuple[int, str, str, int | None]]] = collections.defaultdict(list)
    for mid, attempt, owner, outcome, status in rows:
        history[mid].append((attempt, owner, outcome, status))
        matching = [p for p in processes if p.owns(owner)]
        assert len(matching) == 1, (mid, attempt, owner)
        assert owner_of.setdefault(owner, matching[0]) is matching[0]
        claimer = claimers.get((mid, attempt))
        if claimer:
            assert claimer[0] is matching[0], (mid, attempt, owner, claimer[0].name)
        else:
            # only a claim whose answer was lost (the connection died with it) is
            # unlogged, and nobody but the rescuer can have written its row
            assert outcome == "lease_expired", (mid, attempt, owner, outcome)
    assert len({p.name for p in owner_of.values()}) == len(owner_of)  # one owner per process
    assert set(history) == set(attempts_of)
    for mid, attempts in attempts_of.items():
        numbers = [row[0] for row in history[mid]]
        assert numbers == list(range(1, attempts + 1)), (mid, numbers)
        final = history[mid][-1]
        if mid in dead:
            assert final[2:] == ("failed", 422), (mid, final)
        else:
            assert final[2:] == ("delivered", 200), (mid, final)
        for attempt, _, outcome, _ in history[mid][:-1]:
            assert outcome not in ("delivered", "failed"), (mid, attempt, outcome)

    # the killed and the frozen owners' lost attempts were rescued, against them
    assert set(chaos.killed_rows.items()) <= lease_expired_rows(url, killed)
    assert set(chaos.frozen_rows.items()) <= lease_expired_rows(url, frozen)
    # the thawed dispatcher tried, and was refused: each of those leases was lost
    lost_leases = {e["message_id"] for e in logs[frozen.name] if e["event"] == "lease_lost"}
    assert set(chaos.frozen_rows) <= lost_leases
    if chaos.restarts:
        assert any(e["event"] == "db_error" for p in survivors for e in logs[p.name])

    # -- the receiver: one effect per key; every duplicate deduped ---------------------
    effects = collections.Counter(
        dict(query(url, f"SELECT key, count(*) FROM {INBOX}.effects GROUP BY key"))
    )
    inbox = {row[0] for row in query(url, f"SELECT key FROM {INBOX}.inbox")}
    duplicate_effects = sum(n - 1 for n in effects.values())
    assert duplicate_effects == 0, {k: n for k, n in effects.items() if n > 1}
    assert set(effects) == inbox == set(keys) - poison

    requests = receiver.requests()
    by_key: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    ok_answers: collections.Counter[str] = collections.Counter()
    faults: collections.Counter[str] = collections.Counter()
    for request in requests:
        by_key[request["key"]][request["outcome"]] += 1
        if request["status"] == 200:
            ok_answers[request["key"]] += 1
        if request["fault"]:
            faults[request["fault"]] += 1
    assert set(by_key) == set(keys)
    for key in keys:
        outcomes = by_key[key]
        seen = sum(outcomes.values())
        # each attempt sends at most one request
        assert seen <= attempts_of[ids[key]], (key, seen, attempts_of[ids[key]])
        if key in poison:
            assert set(outcomes) == {"rejected"}, (key, outcomes)
            continue
        # this key's effect was committed by exactly one request (or by one whose
        # commit answer was lost in the restart)
        assert outcomes["applied"] <= 1, (key, outcomes)
        assert outcomes["applied"] + outcomes["ambiguous"] >= 1, (key, outcomes)
        assert ok_answers[key] >= 1, key
    duplicates = sum(outcomes["duplicate"] for outcomes in by_key.values())
    redelivered = len(requests) - len(by_key)
    assert duplicates > 0, "no duplicate reached the receiver: the chaos was too gentle"
    assert set(faults) >= {"500", "429", "slow", "reset", "poison"}, faults
    lease_expired = sum(1 for row in rows if row[3] == "lease_expired")

    print(
        f"\nchaos: messages={len(keys)} delivered={len(delivered)} dead={len(dead)} "
        f"kills={chaos.kills} freezes={chaos.freezes} (frozen {chaos.frozen_for:.1f} s) "
        f"database_restarts={chaos.restarts} requests={len(requests)} "
        f"redeliveries={redelivered} faults={dict(sorted(faults.items()))} "
        f"lease_expired_attempts={lease_expired} fenced_out_leases={len(lost_leases)} "
        f"duplicate_deliveries_observed={duplicates} "
        f"duplicate_effects_applied={duplicate_effects} messages_lost={lost} "
        f"producer_retries={producer_retries} elapsed={elapsed:.1f}s"
    )
