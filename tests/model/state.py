"""The model's state: the rows that matter, as immutable tuples, and its bounds.

A state is a :class:`State`: hashable, so the search keeps each once. Times are
kept relative to now (a lease's ticks left, a breaker's ticks until it may be
probed), so the clock needs no bound of its own: a tick moves every deadline one
step closer, and deadlines that have passed stop there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import NamedTuple


class Mutation(Enum):
    """A seeded bug: the protocol with one rule taken out."""

    FENCE_WITHOUT_ATTEMPT = "completion fenced by owner and state, not the attempt"
    """``complete`` matches ``lease_owner`` and ``state`` but not ``attempts``."""
    ORDERING_WITHOUT_RUNNING_RULE = "ordering_key_free without 'any other of the key running'"
    """``ordering_key_free`` waits only for earlier messages of the key."""
    IDS_WITHOUT_KEY_LOCK = "ids drawn without the ordering-key lock"
    """``enqueue`` without the ``ordered`` fragment's advisory lock."""
    CAP_LOWERED_WITHOUT_RESEAT = "a lowered cap deletes held slots without re-seating"
    """``slots_synced`` without ``cap_reseated``."""
    PROBE_WHILE_PROBING = "a probe taken while another probe's lease runs"
    """``health_probes`` takes a probing row whatever its ``blocked_until``."""
    UNSEATED_NOT_COUNTED = "a request in flight without a slot is not counted"
    """Before migration 0021: "slots_passed" frees a slot rather than passing it to
    a running message that holds none, and ``slots_synced`` seats only the holders
    of the slots it deletes (not the requests claimed before the cap was set)."""


@dataclass(frozen=True)
class Config:
    """The bounds of one exploration.

    :param producers: each producer's one transaction, as the ordering keys of the
        messages it enqueues in turn (None: a message without a key).
    :param committed: the producers' transactions have all committed, one after
        another in order, before any dispatcher starts (their interleavings are
        then left out, where what is checked does not depend on them).
    :param dispatchers: how many dispatchers run.
    :param crashes: how many of them may crash.
    :param stops: how many of them may be stopped (SIGTERM: no more claims, what
        is held is answered and written, or released). Crashes and stops together
        fewer than ``dispatchers``, or nothing is left to deliver what they held.
    :param max_attempts: each message's attempt budget.
    :param lease: a lease's length in ticks.
    :param flights: the most messages one dispatcher holds at once.
    :param cap: the destination's concurrency cap (None: no policy, no slots).
    :param cap_plan: the caps an operator sets, in turn, at any moment.
    :param breaker: whether a failed attempt may open the destination's breaker.
    :param backoff: an open breaker's back-off in ticks.
    :param operator_retries: how many times ``outbox dead retry`` may redrive a
        dead message.
    :param mutations: the seeded bugs in force.
    """

    producers: tuple[tuple[str | None, ...], ...] = ((None,), (None,))
    committed: bool = False
    dispatchers: int = 2
    crashes: int = 1
    stops: int = 0
    max_attempts: int = 2
    lease: int = 2
    flights: int = 2
    cap: int | None = None
    cap_plan: tuple[int, ...] = ()
    breaker: bool = False
    backoff: int = 1
    operator_retries: int = 0
    mutations: frozenset[Mutation] = frozenset()

    def but(self, *mutations: Mutation) -> Config:
        """This configuration with ``mutations`` (seeded bugs) in force."""
        return replace(self, mutations=self.mutations | set(mutations))


class Msg(NamedTuple):
    """A row of ``messages`` (or of ``delivered``), with what the receiver saw of it."""

    id: int
    key: str | None  # ordering_key
    producer: int  # the transaction that wrote it
    state: str  # open (uncommitted) | gone (rolled back) | ready | running | delivered | dead
    attempts: int
    max_attempts: int
    owner: int | None  # lease_owner
    lease: int  # ticks left on lease_until; below 0: expired (lease_until < now())
    rank: int | None  # its transaction's place in commit order, once committed
    arrived: frozenset[int]  # attempt numbers that reached the receiver
    open: frozenset[int]  # attempts that ended with delivery left undecided
    ever_dead: bool
    effects: int  # how many times the receiver applied its idempotency key


class Flight(NamedTuple):
    """A claimed message a dispatcher holds in memory."""

    msg: int
    attempt: int  # the attempt number it claimed at: its fencing token
    phase: str  # claimed | ok | fail (answered) | cut (sent, cut short at shutdown)
    probe: bool  # the claim took the destination's breaker probe with it


class Dispatcher(NamedTuple):
    status: str  # up | stopping | crashed
    flights: tuple[Flight, ...]


class Producer(NamedTuple):
    status: str  # idle | open | committed | rolled back
    written: int  # how many of its messages it has enqueued
    locks: frozenset[str]  # ordering keys whose transaction-scoped lock it holds


class Health(NamedTuple):
    """The destination's ``destination_health`` row (absent: the breaker is closed)."""

    state: str  # open | probing
    owner: int | None  # probe_owner
    blocked: int  # ticks until blocked_until; 0: passed (blocked_until <= now())


class State(NamedTuple):
    msgs: tuple[Msg, ...]  # in id order
    producers: tuple[Producer, ...]
    dispatchers: tuple[Dispatcher, ...]
    slots: tuple[int | None, ...]  # destination_slots: slot n + 1 -> holder's id
    cap: int | None
    cap_step: int  # how many of the cap plan's changes were made
    health: Health | None
    commits: int
    crashes_left: int
    stops_left: int
    retries_left: int


def initial(config: Config) -> State:
    """Every dispatcher up, the cap's slots free; no message written, or (with
    ``config.committed``) every producer's committed in turn."""
    msgs: tuple[Msg, ...] = ()
    if config.committed:
        keys = [(p, key) for p, plan in enumerate(config.producers) for key in plan]
        msgs = tuple(
            Msg(
                n,
                key,
                p,
                "ready",
                0,
                config.max_attempts,
                None,
                0,
                p,
                frozenset(),
                frozenset(),
                False,
                0,
            )
            for n, (p, key) in enumerate(keys)
        )
    status = "committed" if config.committed else "idle"
    return State(
        msgs=msgs,
        producers=tuple(
            Producer(status, len(plan) if config.committed else 0, frozenset())
            for plan in config.producers
        ),
        dispatchers=tuple(Dispatcher("up", ()) for _ in range(config.dispatchers)),
        slots=(None,) * (config.cap or 0),
        cap=config.cap,
        cap_step=0,
        health=None,
        commits=len(config.producers) if config.committed else 0,
        crashes_left=config.crashes,
        stops_left=config.stops,
        retries_left=config.operator_retries,
    )


def describe(state: State) -> str:
    """One readable paragraph: the rows and what the dispatchers hold."""
    lines = []
    for m in state.msgs:
        lease = f" owner=D{m.owner} lease={m.lease}" if m.state == "running" else ""
        lines.append(
            f"  m{m.id} key={m.key} P{m.producer} {m.state} attempts={m.attempts}/"
            f"{m.max_attempts}{lease} commit#={m.rank} arrived={sorted(m.arrived)}"
            f" open={sorted(m.open)}"
        )
    for n, d in enumerate(state.dispatchers):
        held = ", ".join(
            f"m{f.msg}@{f.attempt} {f.phase}{' probe' if f.probe else ''}" for f in d.flights
        )
        lines.append(f"  D{n} {d.status}: [{held}]")
    if state.cap is not None:
        lines.append(f"  cap={state.cap} slots={list(state.slots)}")
    if state.health is not None:
        lines.append(f"  breaker={state.health}")
    return "\n".join(lines)
