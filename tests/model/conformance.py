"""The model against the real statements: walks of the model's actions run on
PostgreSQL, the database compared with the model's state after every step.

A walk starts from :func:`~tests.model.state.initial` and takes seeded random
steps. Each is done through the product's own code (``Outbox.enqueue`` and
``dead_retry``, ``Destinations.set``, the dispatcher's ``Store``: claim, renew,
complete, rescue), while the model takes the same step. Where the protocol leaves
a choice open, the real statement makes it and the model must allow it: a claim
takes what the SQL picks, or nothing, and the model must offer that. A producer
whose key another open transaction holds is started all the same and must wait
on the key's lock. The walk ends at the first difference; :func:`shrink` then
drops actions while the difference remains and prints the shortest walk found.
The clock is the model's: a tick moves every lease back by :data:`TICK`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import re
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from dispatchers.store.messages import Completion
from dispatchers.store.postgres import Store
from outbox import Outbox, admin
from outbox.destinations import Destinations
from tests.dispatching import delivered, fast_config
from tests.model.protocol import Step, steps
from tests.model.state import Config, Flight, State, describe, initial

Action = tuple[Any, ...]
"""What a walk does next: a model step's action (``("complete", d, m, attempt)``),
or one of the driver's own: ``("claim", d)`` (the real claim picks the message),
``("rescue",)`` (whatever the model says of it) and ``("wait", p)`` (a producer's
enqueue started while another transaction holds its key)."""

ORIGIN = "https://conformance.example"
TICK = 1000.0
"""Seconds a tick moves each lease back. A lease of ``n`` ticks is ``n + 1/2``
ticks long, so the wall clock's progress during a walk never decides whether a
lease has run out: only the ticks do."""
WAIT_S = 15.0
"""The bound on waiting for a producer's statement: to block on a lock, or to
return once the lock is free."""
TABLES = (
    "messages",
    "delivered",
    "attempts",
    "destination_policies",
    "destination_slots",
    "unseated_requests",
    "destination_health",
    "message_keys",
)
"""What a walk writes, emptied before the next."""


class Mismatch(AssertionError):
    """The database and the model disagree after a step."""


def owner(d: int) -> str:
    return f"D{d}"


@dataclass
class Walk:
    """One walk's actions, and what it came to."""

    actions: list[Action] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    failure: Mismatch | None = None

    def __str__(self) -> str:
        done = "\n".join(f"  {n + 1:2}. {label}" for n, label in enumerate(self.labels))
        return f"{self.failure}\nafter {len(self.labels)} steps:\n{done}"


class Real:
    """The database one walk runs on: the producers' connections, a dispatcher's
    ``Store`` (one for every dispatcher, told apart by the lease owner), and the
    map from the model's message ids to the database's."""

    def __init__(self, url: str, config: Config, store: Store) -> None:
        self.url = url
        self.config = config
        self.store = store
        self.box = Outbox()
        self.look = psycopg.connect(url, autocommit=True)
        # a producer never waits on a lock past WAIT_S: a wait the model does not
        # have fails the walk, with its trace, rather than hang it
        bound = f"-c lock_timeout={int(WAIT_S * 1000)}"
        self.producers = [psycopg.connect(url, options=bound) for _ in config.producers]
        self.ids: dict[int, int] = {}  # model id -> database id
        self.waiting: tuple[int, Future[int]] | None = None  # producer, its enqueue
        self.threads = ThreadPoolExecutor(max_workers=1)
        self.names = itertools.count()

    def close(self) -> None:
        self._end_wait()
        for conn in (*self.producers, self.look):
            conn.close()
        self.threads.shutdown()

    # -- the start of a walk ---------------------------------------------------

    def reset(self, start: State) -> None:
        """Empty what the last walk wrote and write ``start``'s committed rows."""
        self._end_wait()
        for conn in self.producers:
            conn.rollback()
        tables = ", ".join(f"outbox.{t}" for t in TABLES)
        self.look.execute(f"TRUNCATE {tables} CASCADE")
        self.ids = {}
        if self.config.cap is not None:
            with psycopg.connect(self.url) as conn:
                Destinations().set(conn, ORIGIN, max_concurrency=self.config.cap)
        for m in start.msgs:  # committed before the walk: one transaction each
            conn = self.producers[m.producer]
            self.ids[m.id] = self._enqueue(conn, m.key)
            if all(n.producer != m.producer or n.id <= m.id for n in start.msgs):
                conn.commit()
        self.compare(start)

    def _end_wait(self) -> None:
        """Let a producer still waiting on a key go: its holder rolls back."""
        if self.waiting is None:
            return
        p, waiter = self.waiting
        for q, conn in enumerate(self.producers):
            if q != p:
                conn.rollback()
        waiter.result(timeout=WAIT_S)
        self.producers[p].rollback()
        self.waiting = None

    def _enqueue(self, conn: psycopg.Connection[Any], key: str | None) -> int:
        return self.box.enqueue(
            conn,
            url=f"{ORIGIN}/m",
            idempotency_key=f"c{next(self.names)}",
            json={},
            ordering_key=key,
            max_attempts=self.config.max_attempts,
        )

    # -- one step --------------------------------------------------------------

    async def do(self, s: State, action: Action) -> tuple[State, str]:
        """Do ``action`` on the database and in the model; the model's next state
        and the step's label. Raises :class:`Mismatch` where they part."""
        offered = {step.action: step for step in steps(s, self.config)}
        kind = action[0]
        if kind == "claim":
            return await self._claim(s, offered, action[1])
        if kind == "rescue":
            return await self._rescue(s, offered)
        if kind == "wait":
            self._wait(s, action[1])
            return s, f"P{action[1]} enqueues, and waits for its key's lock"
        step = offered[action]
        if kind == "enqueue":
            self._new_id(s, step, self._enqueue(self.producers[action[1]], self._key(s, action[1])))
        elif kind == "commit":
            self.producers[action[1]].commit()
        elif kind == "rollback":
            self.producers[action[1]].rollback()
        elif kind in ("complete", "release"):
            await self._write(s, step)
        elif kind == "renew":
            await self._renew(s, step, action[1])
        elif kind == "tick":
            self.look.execute(
                "UPDATE outbox.messages SET lease_until = lease_until - make_interval(secs => %s)"
                " WHERE state = 'running'",
                (TICK,),
            )
        elif kind == "cap":
            with psycopg.connect(self.url) as conn:
                Destinations().set(conn, ORIGIN, max_concurrency=action[1])
        elif kind == "retry":
            with psycopg.connect(self.url) as conn:
                count = admin.dead_retry(conn, ids=[self.ids[action[1]]], budget=1, notify=False)
            self._expect(count == 1, f"dead_retry redrove {count} messages, not m{action[1]}")
        # answer, crash, stop: no statement (no breaker in a conformance run)
        return step.state, step.label

    def _key(self, s: State, p: int) -> str | None:
        return self.config.producers[p][s.producers[p].written]

    def _new_id(self, s: State, step: Step, db_id: int) -> None:
        mid = len(s.msgs)
        self.ids[mid] = db_id
        earlier = [self.ids[m] for m in range(mid)]
        self._expect(
            all(e < db_id for e in earlier),
            f"{step.label}: its id {db_id} is below an id drawn before it ({earlier})",
        )

    def _wait(self, s: State, p: int) -> None:
        """Start producer ``p``'s enqueue, which the model says waits for its key;
        return once the session waits on a lock, and fail if the enqueue returns."""
        conn = self.producers[p]
        pid = conn.info.backend_pid
        key = self._key(s, p)
        waiter = self.threads.submit(self._enqueue, conn, key)
        self.waiting = (p, waiter)
        deadline = time.monotonic() + WAIT_S
        while not self._blocked(pid):
            if waiter.done():
                self.waiting = None
                waiter.result()
                raise Mismatch(f"P{p}'s enqueue of key {key} did not wait for the key's lock")
            if time.monotonic() > deadline:
                raise TimeoutError(f"P{p}'s enqueue neither waited nor returned in {WAIT_S} s")
            time.sleep(0.005)  # the poll's pace; the condition is the server's wait event

    def _blocked(self, pid: int) -> bool:
        row = self.look.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        return row is not None and row[0] == "Lock"

    def settle(self, s: State) -> tuple[State, str] | None:
        """The waiting producer's enqueue, once the model lets it go on (its key's
        holder ended): the statement returned when the lock was granted, so it
        comes before anything else the walk does."""
        if self.waiting is None:
            return None
        p, waiter = self.waiting
        step = next((t for t in steps(s, self.config) if t.action == ("enqueue", p)), None)
        if step is None:
            self._expect(not waiter.done(), f"P{p}'s enqueue returned while its key is held")
            return None
        self.waiting = None
        self._new_id(s, step, waiter.result(timeout=WAIT_S))
        return step.state, step.label

    async def _claim(self, s: State, offered: dict[Action, Step], d: int) -> tuple[State, str]:
        allowed = {a[2]: step for a, step in offered.items() if a[:2] == ("claim", d)}
        taken = (await self.store.claim(owner(d), 1)).messages
        if not taken:
            self._expect(
                not allowed, f"D{d}'s claim took nothing; the model allows {self._ms(allowed)}"
            )
            return s, f"D{d} claims nothing"
        (job,) = taken
        mid = self._model_id(job.id)
        if mid is None or mid not in allowed:
            raise Mismatch(f"D{d}'s claim took m{mid}; the model allows {self._ms(allowed)}")
        step = allowed[mid]
        attempt = step.state.msgs[mid].attempts
        self._expect(
            job.attempts == attempt,
            f"D{d} claimed m{mid} at attempt {job.attempts}, the model at {attempt}",
        )
        return step.state, step.label

    async def _rescue(self, s: State, offered: dict[Action, Step]) -> tuple[State, str]:
        rescued = {(self._model_id(i), state) for i, state in await self.store.rescue()}
        step = offered.get(("rescue",))
        after = s if step is None else step.state
        expected = {
            (m.id, after.msgs[m.id].state) for m in s.msgs if m.state == "running" and m.lease < 0
        }
        self._expect(
            rescued == expected, f"the rescue handed on {sorted(rescued)}, not {sorted(expected)}"
        )
        return after, "rescue" if step is not None else "rescue (nothing expired)"

    async def _write(self, s: State, step: Step) -> None:
        _, d, mid, attempt = step.action
        flight = next(f for f in s.dispatchers[d].flights if (f.msg, f.attempt) == (mid, attempt))
        completion = self._completion(s, step.action[0], flight)
        applied, _ = await self.store.complete(owner(d), [completion])
        fenced_in = step.state.msgs[mid] != s.msgs[mid]
        self._expect(
            (self.ids[mid] in applied) == fenced_in,
            f"{step.label}: the database {'applied' if applied else 'fenced out'} the write",
        )

    def _completion(self, s: State, kind: str, f: Flight) -> Completion:
        """The outcome as the dispatcher would write it (dispatchers.runtime.completions)."""
        db_id = self.ids[f.msg]
        if kind == "release":  # claimed after the stop signal, never sent
            return Completion(db_id, f.attempt, "ready", "released", sent=False)
        if f.phase == "ok":
            return delivered(db_id, f.attempt)
        now = datetime.now(UTC)
        if f.phase == "cut":  # cut short at shutdown: the attempt counts
            return Completion(
                db_id, f.attempt, "ready", "released", sent=True, error_class="shutdown",
                started_at=now, duration_ms=1,
            )  # fmt: skip
        spent = f.attempt >= s.msgs[f.msg].max_attempts  # retried at once: no delay
        return Completion(
            db_id, f.attempt, "dead" if spent else "ready", "retry", sent=True, status=503,
            started_at=now, duration_ms=1,
        )  # fmt: skip

    async def _renew(self, s: State, step: Step, d: int) -> None:
        held = [(self.ids[f.msg], f.attempt) for f in s.dispatchers[d].flights]
        kept = {self._model_id(i) for i in await self.store.renew(owner(d), held)}
        expected = {f.msg for f in step.state.dispatchers[d].flights}
        self._expect(kept == expected, f"D{d} renewed {self._ms(kept)}, not {self._ms(expected)}")

    # -- the comparison --------------------------------------------------------

    def compare(self, s: State) -> None:
        """The committed rows, the slots and the unseated requests, as the model has them."""
        rows = {
            r[0]: r[1:]
            for r in self.look.execute(
                "SELECT id, state::text, attempts, max_attempts, lease_owner,"
                " lease_until < now() FROM outbox.messages"
            )
        }
        history: dict[int, int] = dict(
            self.look.execute("SELECT id, attempts FROM outbox.delivered").fetchall()
        )
        expected: dict[int, tuple[Any, ...]] = {}
        expected_history: dict[int, int] = {}
        for m in s.msgs:
            if m.state == "delivered":
                expected_history[self.ids[m.id]] = m.attempts
            elif m.state in ("ready", "running", "dead"):
                running = m.state == "running"
                expected[self.ids[m.id]] = (
                    m.state,
                    m.attempts,
                    m.max_attempts,
                    owner(m.owner) if running and m.owner is not None else None,
                    (m.lease < 0) if running else None,
                )
        self._expect(rows == expected, self._diff("messages", rows, expected))
        self._expect(
            history == expected_history, self._diff("delivered", history, expected_history)
        )
        slots = self.look.execute(
            "SELECT slot, message_id FROM outbox.destination_slots ORDER BY slot"
        ).fetchall()
        want = [(n + 1, None if h is None else self.ids[h]) for n, h in enumerate(s.slots)]
        self._expect(slots == want, f"slots {slots}, the model's {want}")
        if s.cap is not None:
            listed = {
                r[0] for r in self.look.execute("SELECT message_id FROM outbox.unseated_requests")
            }
            unseated = {
                self.ids[m.id] for m in s.msgs if m.state == "running" and m.id not in s.slots
            }
            self._expect(
                listed == unseated, f"unseated {sorted(listed)}, the model's {sorted(unseated)}"
            )

    def _diff(self, table: str, real: dict[int, Any], model: dict[int, Any]) -> str:
        lines = [f"{table} differs from the model (database id: real / model):"]
        for i in sorted(real.keys() | model.keys()):
            if real.get(i) != model.get(i):
                lines.append(f"  {i} (m{self._model_id(i)}): {real.get(i)} / {model.get(i)}")
        return "\n".join(lines)

    def _model_id(self, db_id: int) -> int | None:
        return next((m for m, i in self.ids.items() if i == db_id), None)

    @staticmethod
    def _ms(ids: Any) -> str:
        return "[" + ", ".join(f"m{i}" for i in sorted(ids)) + "]" if ids else "nothing"

    @staticmethod
    def _expect(holds: bool, message: str) -> None:
        if not holds:
            raise Mismatch(message)


def menu(s: State, config: Config, real: Real) -> list[Action]:
    """What a walk may do in ``s``: the model's steps, with its claims and rescues
    left to the real statements, and a producer started on a key another holds."""
    actions: list[Action] = []
    for step in steps(s, config):
        kind = step.action[0]
        if kind in ("claim", "rescue"):
            continue
        if real.waiting is not None and step.action[1:2] == (real.waiting[0],):
            continue  # the waiting producer does nothing else
        actions.append(step.action)
    for d, disp in enumerate(s.dispatchers):
        if disp.status == "up" and len(disp.flights) < config.flights:
            actions.append(("claim", d))
    actions.append(("rescue",))
    if real.waiting is None:
        offered = {a for a in actions if a[0] == "enqueue"}
        for p, prod in enumerate(s.producers):
            plan = config.producers[p]
            if (
                prod.status in ("idle", "open")
                and prod.written < len(plan)
                and plan[prod.written] is not None
                and ("enqueue", p) not in offered
            ):
                actions.append(("wait", p))
    return actions


@dataclass
class Tally:
    """What the walks of one run reached: states, and kinds of step taken."""

    config: Config
    walks: int = 0
    steps: int = 0
    states: set[State] = field(default_factory=set)
    kinds: set[tuple[object, ...]] = field(default_factory=set)

    def seen(self, before: State, after: State) -> None:
        self.states.add(after)
        for step in steps(before, self.config):
            if step.state == after:
                self.kinds.add(kind(before, step))


NOVELTY = 0.9
"""How often a walk takes an action that may lead to a state no walk of the run
has reached yet, when there is one: the walks spread over the model's states
rather than wander the few near the start."""


def kind(s: State, step: Step) -> tuple[object, ...]:
    """What a step does, without which message or dispatcher: its label without
    numbers, and where it touches a message, that message's state, whether
    another of its key is running, and (for a write) whether the writer holds it
    now, at the attempt it writes. A walk seeks the kinds no walk has taken yet."""
    label = re.sub(r"\d+", "#", step.label)
    action = step.action
    if action[0] in ("complete", "release", "answer"):
        d, mid, attempt = action[1:4]
    elif action[0] in ("retry", "claim"):
        d, mid, attempt = None, action[-1], None
    else:
        return (label,)
    m = s.msgs[mid]
    busy = any(
        o.key == m.key and o.id != m.id and o.state == "running"
        for o in s.msgs
        if m.key is not None
    )
    return (label, m.state, busy, m.owner == d, m.attempts == attempt)


def _choose(
    rng: random.Random, s: State, config: Config, allowed: list[Action], tally: Tally | None
) -> Action:
    """A random action, or with :data:`NOVELTY`'s chance one of a kind no walk
    took yet, else one that may reach a state no walk reached."""
    if tally is None or rng.random() >= NOVELTY:
        return rng.choice(allowed)
    kinds: dict[Action, set[tuple[object, ...]]] = {}
    nexts: dict[Action, list[State]] = {}
    for step in steps(s, config):
        action = step.action[:2] if step.action[0] == "claim" else step.action
        kinds.setdefault(action, set()).add(kind(s, step))
        nexts.setdefault(action, []).append(step.state)
    new = [a for a in allowed if kinds.get(a, set()) - tally.kinds]
    if new:
        return rng.choice(new)
    novel = [a for a in allowed if any(n not in tally.states for n in nexts.get(a, ()))]
    return rng.choice(novel or allowed)


async def run(
    real: Real,
    actions: Sequence[Action] | None,
    rng: random.Random | None,
    length: int,
    tally: Tally | None = None,
) -> Walk:
    """A walk: ``actions`` replayed (those the state does not allow are left out),
    or ``length`` actions chosen by ``rng``; each state reached is added to ``seen``."""
    s = initial(real.config)
    walk = Walk()
    real.reset(s)
    script = iter(actions or ())
    action: Action = ()
    try:
        for _ in range(length if actions is None else len(actions)):
            allowed = menu(s, real.config, real)
            if rng is not None:
                action = _choose(rng, s, real.config, allowed, tally)
            else:
                action = next(script)
                if action not in allowed:
                    continue
            before = s
            try:
                s, label = await real.do(s, action)
            except psycopg.Error as e:  # a step the model takes, refused
                raise Mismatch(f"{action}: the database raised {type(e).__name__}: {e}") from e
            walk.actions.append(action)
            walk.labels.append(label)
            settled = real.settle(s)
            if settled is not None:
                s, label = settled
                walk.labels.append(label)
            real.compare(s)
            if tally is not None:
                tally.seen(before, s)
    except Mismatch as e:
        walk.actions.append(action)
        walk.labels.append(f"{action}: here the database parts from the model")
        walk.failure = Mismatch(f"{e}\nthe model's state before:\n{describe(s)}")
    return walk


async def shrink(real: Real, walk: Walk, most: int = 200) -> Walk:
    """A shorter walk that still fails: actions dropped, in chunks and then one at
    a time, while the walk still fails (at most ``most`` replays)."""
    best = walk
    chunk = max(1, len(best.actions) // 2)
    replays = 0
    while chunk >= 1 and replays < most:
        start, shrunk = 0, False
        while start < len(best.actions) and replays < most:
            trial = best.actions[:start] + best.actions[start + chunk :]
            replays += 1
            attempt = await run(real, trial, None, 0)
            if attempt.failure is not None:
                best, shrunk = attempt, True
            else:
                start += chunk
        if not shrunk:
            chunk //= 2
    return best


async def check(
    url: str,
    config: Config,
    *,
    walks: int,
    length: int,
    seed: int = 0,
    shrinks: int = 200,
) -> tuple[Walk | None, Tally]:
    """``walks`` walks of ``length`` actions from ``seed`` on; the first that
    fails, shrunk (in at most ``shrinks`` replays), or None; and what the walks reached."""
    store = Store(url, fast_config(lease=(config.lease + 0.5) * TICK, destination_concurrency=100))
    await store.open()
    real = Real(url, config, store)
    tally = Tally(config)
    try:
        for n in range(walks):
            rng = random.Random(seed * 1_000_003 + n)
            walk = await run(real, None, rng, length, tally)
            tally.walks += 1
            tally.steps += len(walk.actions)
            if walk.failure is not None:
                return await shrink(real, walk, shrinks), tally
        return None, tally
    finally:
        real.close()
        await store.close()


@contextlib.contextmanager
def planted(name: str) -> Iterator[str]:
    """The statements loaded, for this process, from a copy of the SQL with the
    mutant ``name`` of :mod:`tests.mutation.sql_mutants` made in it."""
    from tests.mutation import sql_copy, sql_mutants

    mutant = sql_mutants.MUTANTS[name]
    work = Path(tempfile.mkdtemp(prefix="outbox-conformance-"))
    try:
        for part in ("sql", "dispatchers"):
            shutil.copytree(sql_mutants.ROOT / part, work / part, ignore=sql_mutants.IGNORED)
        path = work / mutant.file
        mutated = mutant.apply(path.read_text("utf-8"))
        if mutated is None:
            raise SystemExit(
                f"{name} does not apply: {mutant.old!r} is not once in {mutant.section}"
            )
        path.write_text(mutated, "utf-8")
        sql_copy._point_at(work)
        yield f"{mutant.file}:{mutant.section}"
    finally:
        sql_copy._patch.undo()
        sql_copy._clear()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    from tests.model.scenarios import CONFORMANCE
    from tests.mutation import sql_mutants

    parser = argparse.ArgumentParser(
        prog="python -m tests.model.conformance", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--walks", type=int, default=2000, help="walks per scenario (2000)")
    parser.add_argument("--length", type=int, default=40, help="actions per walk (40)")
    parser.add_argument("--seed", type=int, default=0, help="the first walk's seed (0)")
    parser.add_argument(
        "--scenario", dest="scenarios", action="append", choices=sorted(CONFORMANCE),
        metavar="NAME", help=f"one of {', '.join(CONFORMANCE)}; may be repeated (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--plant", metavar="MUTANT", choices=sorted(sql_mutants.MUTANTS),
        help="run against the SQL with this mutant of tests.mutation.sql_mutants made",
    )  # fmt: skip
    parser.add_argument("--database-url", help="a server of your own (default: an embedded one)")
    args = parser.parse_args(argv)
    names = args.scenarios or list(CONFORMANCE)
    with contextlib.ExitStack() as stack:
        if args.plant:
            print(f"planted: {args.plant} in {stack.enter_context(planted(args.plant))}")
        url = stack.enter_context(_database(args.database_url))
        failures = 0
        for name in names:
            reach = reachable(CONFORMANCE[name])
            started = time.monotonic()
            failed, tally = asyncio.run(
                check(url, CONFORMANCE[name], walks=args.walks, length=args.length, seed=args.seed)
            )
            print(
                f"{name}: {tally.walks} walks, {tally.steps} steps,"
                f" {_of(len(tally.states), reach[0])} states,"
                f" {_of(len(tally.kinds), None if reach[1] is None else len(reach[1]))} kinds"
                f" of step, {time.monotonic() - started:.1f} s:"
                f" {'FAILED' if failed else 'conforms'}",
                flush=True,
            )
            if reach[1] is not None and not failed:
                for missed in sorted(map(str, reach[1] - tally.kinds)):
                    print(f"  never taken: {missed}")
            if failed is not None:
                failures += 1
                print(textwrap.indent(str(failed), "  "), flush=True)
    return 1 if failures else 0


def _of(part: int, whole: int | None) -> str:
    return f"{part:,}" if whole is None else f"{part:,} of {whole:,}"


def reachable(config: Config, most: int = 300_000) -> tuple[int | None, set[Any] | None]:
    """How many states the model reaches under ``config``, and the kinds of step
    it can take (:func:`kind`); (None, None) past ``most`` states."""
    start = initial(config)
    seen = {start}
    kinds: set[Any] = set()
    frontier = [start]
    while frontier:
        following = []
        for s in frontier:
            for step in steps(s, config):
                kinds.add(kind(s, step))
                if step.state not in seen:
                    if len(seen) >= most:
                        return None, None
                    seen.add(step.state)
                    following.append(step.state)
        frontier = following
    return len(seen), kinds


@contextlib.contextmanager
def _database(url: str | None) -> Iterator[str]:
    """A fresh migrated database on ``url``'s server, or on an embedded one."""
    from dispatchers.embedded import EmbeddedPostgres
    from tests.conftest import PgServer, _throwaway

    with contextlib.ExitStack() as stack:
        if url:
            pg = PgServer.connect(url, "external")
        else:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            embedded = EmbeddedPostgres(home / "pg", delete=True)
            stack.callback(embedded.cleanup)
            _throwaway(embedded.url)
            pg = PgServer.connect(embedded.url, "embedded", embedded=embedded)
        pg.template_url()
        name = f"conformance_{os.getpid()}"
        database = pg.create_database(name, template=pg.template)
        try:
            yield database
        finally:
            pg.drop_database(name)
            pg.drop_database(pg.template)


if __name__ == "__main__":
    sys.exit(main())
