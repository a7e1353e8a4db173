"""Play one seed's plan against the real system and return its history.

``run(seed, database_url, workdir, server=...)`` takes a fresh, migrated
database and its server, which the plan's database restart stops and starts
(None: the server is not the run's to restart, and that step is skipped, with a
note). In order:
the audit triggers and the inbox are installed, the receivers' process started,
the destinations and their first policies created, the dispatchers started and
waited for; then the producers run while the plan's steps are taken in turn
(each no earlier than its time, each a bounded wait for its condition) and
``pg_locks`` is sampled (:mod:`tests.history.locks`); then the run waits for
every committed message to be delivered or dead, stops everything (SIGTERM), and
reads the history from the database, the receivers' log and the dispatchers'
logs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import psycopg

from outbox import Destinations, OutboxError
from outbox.admin import dead_retry, replay_message
from outbox.endpoints import Endpoints
from tests.history import audit
from tests.history.collect import collect
from tests.history.fence import fence
from tests.history.fleet import Fleet
from tests.history.history import Destination, Fault, History, Operation, PolicyChange, Timing
from tests.history.locks import LockSampler
from tests.history.producers import Producer
from tests.history.receiver import ensure_inbox
from tests.history.workload import Op, Plan, Step, TxnPlan, plan
from tests.processes import query, wait_until

SETTLE_TIMEOUT = 90.0
"""Seconds after the last producer for every committed message to end delivered
or dead: retries, probes, rate limits and rescues included."""
RETRY_SCHEDULE = (0.1, 0.2, 0.4)
"""The endpoints' retry schedule: quick, so that a run settles."""
OUTAGE = (0.5, 1.5)
"""Seconds the database stays down when it is restarted (seeded between)."""
CONTEND_HOLD = 1.5
"""Seconds the first writer of a contended ordering key holds its lock."""
OPERATED = 2
"""How many messages one replay or dead retry names (fewer if fewer are there)."""
RETRY_BUDGET = 5
"""The attempts a dead retry gives: a ``lapsed-`` message's receiver may still
fail two of them (``tests.history.receiver``)."""


class Server(Protocol):
    """What a database restart needs of the server (``tests.conftest.PgServer``)."""

    def stop(self) -> None: ...

    def start(self) -> None: ...


class Receivers:
    """``tests.history.receiver`` as a subprocess, killed at the end whatever happens."""

    def __init__(self, workdir: Path, config: dict[str, Any], database_url: str) -> None:
        self.log_path = workdir / "requests.jsonl"
        self.traps_path = workdir / "traps.jsonl"
        ready = workdir / "receivers.json"
        config_path = workdir / "receivers-config.json"
        config_path.write_text(json.dumps(config), encoding="utf-8")
        self.stderr_path = workdir / "receivers.stderr"
        argv = [
            sys.executable,
            "-m",
            "tests.history.receiver",
            "--config",
            str(config_path),
            "--log",
            str(self.log_path),
            "--ready",
            str(ready),
            "--traps",
            str(self.traps_path),
            "--database-url",
            database_url,
        ]
        with open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=err, stderr=err, cwd=workdir
            )
        try:
            ports = wait_until(
                lambda: self._ready(ready), timeout=60, what="the receivers to listen"
            )
        except BaseException:
            self.kill()
            raise
        assert ports is not None
        self.ports: dict[str, int] = ports

    def _ready(self, ready: Path) -> dict[str, int] | None:
        if self.popen.poll() is not None:
            raise AssertionError(f"the receivers exited: {self.stderr()}")
        return json.loads(ready.read_text(encoding="utf-8")) if ready.exists() else None

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-3000:]

    def control(self, destination: str, mode: str, **extra: object) -> None:
        assert self.popen.stdin is not None
        line = {"destination": destination, "mode": mode, **extra}
        self.popen.stdin.write(json.dumps(line).encode())
        self.popen.stdin.write(b"\n")
        self.popen.stdin.flush()

    def stop(self) -> int:
        self.popen.terminate()
        try:
            return self.popen.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the receivers did not stop: {self.stderr()}") from None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()

    def lines(self) -> list[dict[str, Any]]:
        if not self.log_path.exists():
            return []
        return [json.loads(x) for x in self.log_path.read_text(encoding="utf-8").splitlines() if x]


def _secret(seed: int, name: str) -> str:
    raw = random.Random(f"{seed}:{name}:secret").randbytes(24)
    return "whsec_" + base64.b64encode(raw).decode()


class Harness:
    def __init__(
        self,
        p: Plan,
        url: str,
        workdir: Path,
        server: Server | None,
        progress: Callable[[str], None],
    ) -> None:
        self.plan = p
        self.url = url
        self.workdir = workdir
        self.server = server
        self.progress = progress
        self.destinations: dict[str, Destination] = {}
        self.endpoint_ids: dict[str, int] = {}
        self.policies: list[PolicyChange] = []
        self.faults: list[Fault] = []
        self.notes: list[str] = []
        self.fleet = Fleet(url, p.settings.args(), workdir, p.settings.lease)
        self.operator: Producer | None = None
        self.extras: list[Producer] = []  # the producers of a contention
        self.operations: list[Operation] = []

    def setup(self, receivers: Receivers) -> None:
        with psycopg.connect(self.url, application_name="history-harness") as conn:
            for r in self.plan.receivers:
                base = f"http://127.0.0.1:{receivers.ports[r.name]}"
                if r.kind == "plain":
                    self.destinations[r.name] = Destination(
                        r.name, "plain", base, f"{base}/{r.name}", inbox=r.inbox
                    )
                    continue
                secret = _secret(self.plan.seed, r.name)
                endpoint = Endpoints().add(
                    conn,
                    url=f"{base}/{r.name}",
                    event_types=list(r.event_types),
                    secret=secret,
                    retry_schedule=RETRY_SCHEDULE,
                )
                self.endpoint_ids[r.name] = endpoint.id
                target = f"endpoint:{endpoint.id}"
                self.destinations[r.name] = Destination(
                    r.name, "endpoint", target, target, inbox=r.inbox, secret=secret
                )
            conn.commit()
        for r in self.plan.receivers:
            if r.cap is not None or r.rate is not None:
                self.set_policy(r.name, cap=r.cap, rate=r.rate, burst=r.burst, initial=True)

    def set_policy(
        self,
        name: str,
        *,
        cap: int | None = None,
        rate: float | None = None,
        burst: int | None = None,
        initial: bool = False,
    ) -> None:
        """Set ``name``'s cap or rate limit (the other bound kept as it was)."""
        previous = next((p for p in reversed(self.policies) if p.destination == name), None)
        if previous is not None:
            cap = cap if cap is not None else previous.cap
            if rate is None:
                rate, burst = previous.rate, previous.burst
        d = self.destinations[name]
        if not initial and cap is not None:
            self.burst(d)
            self.while_busy(d, least=min(2, previous.cap or 2) if previous else 2)
        before = time.time()
        with psycopg.connect(self.url, application_name="history-harness") as conn:
            if d.kind == "plain":
                Destinations().set(
                    conn, d.destination, max_concurrency=cap, rate_limit=rate, burst=burst
                )
            else:
                Endpoints().update(
                    conn,
                    self.endpoint_ids[name],
                    max_concurrency=cap,
                    rate_limit=rate,
                    burst=burst,
                )
            conn.commit()
        after = time.time()
        self.policies.append(PolicyChange(name, cap, rate, burst, before, after))
        if not initial:
            kind = "cap_change" if cap != (previous.cap if previous else None) else "rate_change"
            self.faults.append(Fault(kind, name, before, after, f"cap {cap} rate {rate}/{burst}"))

    def burst(self, d: Destination) -> None:
        """Commit a burst of messages to ``d`` (publish an event its endpoint takes),
        as the operator's own producer (number 0), so that the cap changes while
        they run."""
        assert self.operator is not None
        for _ in range(2):  # again if its connection died with a database restart
            n = len(self.operator.txns)
            keys = [f"burst-{d.name}-{n}-{i}" for i in range(6)]
            if d.kind == "plain":
                ops = tuple(Op("enqueue", d.name, k, None, 25) for k in keys)
            else:
                ops = tuple(Op("publish", "order.shipped", k) for k in keys)
            txn = self.operator.play(n, TxnPlan(ops, True, 0.0, 0.0))
            self.operator.txns.append(txn)
            if txn.committed:
                return

    def while_busy(self, d: Destination, least: int = 2) -> None:
        """Wait (a few seconds at most) until ``least`` requests to ``d`` are in
        flight, so that a cap changes under running requests; noted if none came."""
        try:
            wait_until(
                lambda: (
                    query(
                        self.url,
                        "SELECT count(*) FROM outbox.messages WHERE destination = %s"
                        " AND state = 'running'",
                        (d.destination,),
                    )[0][0]
                    >= least
                ),
                timeout=4.0,
                what=f"{least} requests in flight to {d.name}",
                interval=0.02,
            )
        except AssertionError as exc:
            self.notes.append(f"cap changed on an idle destination: {str(exc).splitlines()[0]}")

    def step(self, s: Step, receivers: Receivers, rng: random.Random) -> None:
        self.progress(f"step {s.kind} {s.destination}".rstrip())
        if s.kind in ("cap_change", "rate_change"):
            self.set_policy(s.destination, cap=s.cap, rate=s.rate, burst=s.burst)
        elif s.kind == "kill":
            self.fleet.kill(s.victim)
        elif s.kind == "freeze":
            self.fleet.freeze(s.victim, through_rescue=rng.random() < 0.5)
        elif s.kind == "term":
            self.fleet.terminate(s.victim)
        elif s.kind == "breaker":
            receivers.control(s.destination, "down")
            self.faults.append(Fault("breaker", s.destination, time.time(), time.time()))
        elif s.kind == "breaker_up":
            receivers.control(s.destination, "up")
            for i, f in enumerate(self.faults):
                if f.kind == "breaker" and f.target == s.destination:
                    self.faults[i] = Fault(f.kind, f.target, f.at, time.time())
        elif s.kind == "fence":
            faults, notes = fence(self.fleet, receivers, self.destinations[s.destination], self.url)
            self.faults += faults
            self.notes += notes
        elif s.kind == "contend":
            self.contend(s.destination)
        elif s.kind == "lapse":
            self.lapse(self.destinations[s.destination])
        elif s.kind in ("dead_retry", "replay"):
            self.operate(s.kind, s.victim)
        elif s.kind == "db_restart":
            if self.server is None:
                self.notes.append("database restart skipped: the server is not the run's")
                return
            at = time.time()
            outage = rng.uniform(*OUTAGE)
            self.server.stop()
            try:
                threading.Event().wait(outage)  # the outage itself, not a wait for anything
            finally:
                self.server.start()
            self.faults.append(
                Fault("db_restart", "postgresql", at, time.time(), f"{outage:.1f} s")
            )

    def lapse(self, d: Destination) -> None:
        """Commit two messages to ``d`` that go dead (``lapsed-`` keys, two
        attempts), as the operator's producer, for a dead retry to find."""
        assert self.operator is not None
        n = len(self.operator.txns)
        ops = tuple(Op("enqueue", d.name, f"lapsed-{n}-{i}", None, 2) for i in range(2))
        self.operator.txns.append(self.operator.play(n, TxnPlan(ops, True, 0.0, 0.0)))

    def contend(self, ordering_key: str) -> None:
        """Three producer transactions write ``ordering_key`` at once: the first
        holds its lock :data:`CONTEND_HOLD` seconds, the other two wait for it
        together. Producers of their own (numbered after the planned ones), each
        one transaction; what the database saw is the lock sampler's."""
        at = time.time()
        first = len(self.plan.producers) + len(self.extras) + 1
        targets = {n: d.target for n, d in self.destinations.items() if d.kind == "plain"}

        def producer(i: int, hold: float) -> Producer:
            op = Op("enqueue", "inbox", f"contend-{first}-{i}", ordering_key, 25)
            p = Producer(first + i, self.url, (TxnPlan((op,), True, hold, 0.0),), targets)
            self.extras.append(p)
            p.start()
            return p

        def advisory(granted: bool) -> list[str]:
            """The sessions holding (or waiting for) an advisory lock."""
            rows = query(
                self.url,
                "SELECT a.application_name FROM pg_locks AS l"
                " JOIN pg_stat_activity AS a ON a.pid = l.pid"
                " WHERE l.locktype = 'advisory' AND l.granted = %s"
                " AND a.datname = current_database()",
                (granted,),
            )
            return [str(r[0]) for r in rows]

        holder = producer(0, CONTEND_HOLD)
        try:
            wait_until(
                lambda: f"producer-{first}" in advisory(True),
                timeout=5.0,
                what=f"producer {first} to hold the lock of {ordering_key}",
                interval=0.01,
            )
            names = {f"producer-{p.number}" for p in (producer(1, 0.0), producer(2, 0.0))}
            wait_until(
                lambda: len(names.intersection(advisory(False))) == 2,
                timeout=CONTEND_HOLD,
                what=f"two producers to wait for the lock of {ordering_key}",
                interval=0.02,
            )
        except AssertionError as exc:
            self.notes.append(str(exc).splitlines()[0])
        for p in self.extras[self.extras.index(holder) :]:
            p.join(CONTEND_HOLD + 30)
        self.faults.append(Fault("contend", ordering_key, at, time.time()))

    def operate(self, kind: str, pick: int) -> None:
        """An operator's ``dead_retry`` of dead messages, or ``replay_message`` of
        delivered webhooks, :data:`OPERATED` of them picked from those there by
        ``pick``, in one transaction of the session ``history-operator``; waits
        (bounded) for one to be there."""
        listing = (
            "SELECT id FROM outbox.messages WHERE state = 'dead' ORDER BY id"
            if kind == "dead_retry"
            else "SELECT id FROM outbox.delivered"
            " WHERE endpoint_id IS NOT NULL AND expunged_at IS NULL ORDER BY id"
        )
        try:
            ids = wait_until(
                lambda: [int(r[0]) for r in query(self.url, listing)],
                timeout=8.0,
                what=f"a message to {kind.replace('_', ' ')}",
                interval=0.1,
            )
        except AssertionError as exc:
            self.notes.append(str(exc).splitlines()[0])
            return
        chosen = tuple(sorted({ids[(pick + i * 7) % len(ids)] for i in range(OPERATED)}))
        before = time.time()
        xid: int | None = None
        moved: int | None = None
        error: str | None = None
        try:
            with psycopg.connect(self.url, application_name="history-operator") as conn:
                row = conn.execute("SELECT CAST(pg_current_xact_id() AS text)").fetchone()
                xid = int(row[0]) if row else None
                if kind == "dead_retry":
                    moved = dead_retry(conn, ids=chosen, budget=RETRY_BUDGET)
                else:
                    moved = sum(replay_message(conn, message_id=i) for i in chosen)
                conn.commit()
        except (psycopg.Error, OutboxError) as exc:
            moved, error = None, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        self.operations.append(Operation(kind, chosen, xid, before, time.time(), moved, error))

    def settle(self, timeout: float) -> None:
        """Wait until no committed message is ready, running or paused."""
        try:
            wait_until(
                lambda: (
                    not query(
                        self.url, "SELECT 1 FROM outbox.messages WHERE state <> 'dead' LIMIT 1"
                    )
                ),
                timeout=timeout,
                what="every committed message to be delivered or dead",
                interval=0.25,
            )
        except AssertionError as exc:
            self.notes.append(str(exc).splitlines()[0])


def run(
    seed: int,
    database_url: str,
    workdir: Path,
    *,
    server: Server | None,
    short: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> History:
    """Play ``seed``'s plan (see the module's docstring) and return its history."""
    p = plan(seed, short=short)
    rng = random.Random(f"{seed}:run")
    audit.install(database_url)
    ensure_inbox(database_url)
    harness = Harness(p, database_url, workdir, server, progress)
    specs = [
        {
            "name": r.name,
            "inbox": r.inbox,
            "fault_rate": r.fault_rate,
            "weights": r.weights,
            "slow_share": r.slow_share,
            "slow": list(r.slow),
            "secret": _secret(seed, r.name) if r.kind == "endpoint" else None,
        }
        for r in p.receivers
    ]
    config = {"seed": seed, "request_timeout": p.settings.request_timeout, "specs": specs}
    receivers = Receivers(workdir, config, database_url)
    producers: list[Producer] = []
    fleet = harness.fleet
    sampler = LockSampler(database_url)
    try:
        harness.setup(receivers)
        fleet.wait_started([fleet.start() for _ in range(p.settings.dispatchers)])
        progress(f"seed {seed}: {len(p.producers)} producers, {len(p.steps)} steps")
        targets = {n: d.target for n, d in harness.destinations.items() if d.kind == "plain"}
        harness.operator = Producer(0, database_url, (), targets)
        producers = [
            Producer(i + 1, database_url, plans, targets) for i, plans in enumerate(p.producers)
        ]
        began = time.monotonic()
        sampler.start()
        for producer in producers:
            producer.start()
        pace = threading.Event()
        for s in p.steps:
            pace.wait(max(0.0, began + s.at - time.monotonic()))
            harness.step(s, receivers, rng)
        for producer in producers:
            producer.join(timeout=p.traffic + 120)
            if producer.is_alive() or producer.error is not None:
                harness.notes.append(
                    f"producer {producer.number} did not finish: {producer.error!r}"
                )
        lock_waits = sampler.stop()
        progress("settling")
        harness.settle(SETTLE_TIMEOUT)
        fleet.stop_all()
        code = receivers.stop()
        if code != 0:
            harness.notes.append(f"the receivers exited {code}: {receivers.stderr()}")
    finally:
        sampler.stop()
        for producer in (*producers, *harness.extras):
            producer.stop(5)
        if harness.operator is not None and harness.operator.conn is not None:
            harness.operator.conn.close()
        receivers.kill()
        fleet.kill_all()
    return collect(
        harness,
        seed=seed,
        timing=Timing(p.settings.lease, p.settings.request_timeout, p.settings.statement_timeout),
        txns=[
            t
            for x in (harness.operator, *producers, *harness.extras)
            if x is not None
            for t in x.txns
        ],
        requests=receivers.lines(),
        lock_waits=lock_waits,
    )
