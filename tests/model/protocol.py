"""The protocol's actions: each statement (one transaction) as one atomic step.

:func:`steps` lists every step a state allows, each with the state it leads to
and the contract's rules that step broke (:mod:`tests.model.invariants` checks
them). Beside each action, the statement or fragment it models.

Where the model simplifies:

- One destination, every message's; no rate limit, no hold (Retry-After), no
  endpoint (so nothing is paused or disabled) and no retention.
- A claim takes one message. A batch claim checks each candidate against one
  snapshot, at most one per ordering key (the earliest ready one holds the rest
  back), one slot each, one probe per destination: it takes no set that
  successive one-message claims could not. Which claimable message is taken is
  left open (the SQL takes the first by ``available_at, id``): a superset.
- Retry delays are 0 (a retried message is due at once), and an open breaker's
  back-off is ``Config.backoff`` ticks every time (the SQL doubles it per failed
  probe). The outcome's verdict (retry or dead) uses the row's ``max_attempts``.
- A request reaching the receiver and its answer coming back are one step (no
  rule looks between them); a dispatcher that crashes before that step sent
  nothing, one that crashes after it lost the answer. At shutdown a request may
  also be cut short after it reached the receiver, or a claim given back unsent.
- The dispatcher's timing assumptions, which the lease budget makes true: a
  claimed message is sent, and answered, before the clock moves (the request
  timeout is below the lease). So a tick waits for every claimed message of a
  dispatcher that has not crashed to be answered; what outlives a lease is an
  answered outcome whose write is late (a slow or failing database), or a
  crashed dispatcher's rows.
- A dispatcher may write any outcome it holds, also one of an attempt it has
  since claimed again (a batch taken for writing before the new claim returned,
  which its own bookkeeping can no longer recall): the fence alone must stop it.
  It drops the flights a renewal did not return (its heartbeat does).
- The breaker opens on any failed answer while closed (the dispatcher's
  HealthBook waits for a share of failures in a window); a probe's answer
  writes ``health_close`` or ``health_reopen`` at once, as
  ``Breakers.attempted`` does after the response.
- A crash loses the dispatcher's memory for good (it does not come back under
  its name); a stopped dispatcher claims nothing more and is not started again.
- Producers' statements run one at a time; a producer that needs a key another
  open transaction has locked waits, and may roll back (as a deadlock victim).
- In flight at the destination means running rows (what the slots count): a
  request whose lease ended unrecorded is not counted once it is rescued.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, TypeVar

from tests.model import invariants as rules
from tests.model.state import (
    Config,
    Dispatcher,
    Flight,
    Health,
    Msg,
    Mutation,
    Producer,
    State,
)

_T = TypeVar("_T", bound=tuple[object, ...])


class Step(NamedTuple):
    label: str
    state: State
    broken: tuple[str, ...]
    action: tuple[Any, ...]
    """What was done, by whom, as :mod:`tests.model.conformance` replays it on
    the real statements: the label's words as values (``("claim", d, m)``,
    ``("complete", d, m, attempt)``, ``("tick",)``...)."""


def steps(s: State, c: Config) -> Iterator[Step]:
    """Every step ``s`` allows under ``c``."""
    yield from _producers(s, c)
    for d, disp in enumerate(s.dispatchers):
        if disp.status != "crashed":
            yield from _dispatcher(s, c, d, disp)
    yield from _maintenance(s, c)


# -- helpers ---------------------------------------------------------------------


def _msg(s: State, mid: int) -> Msg:
    return s.msgs[mid]  # ids are drawn from 0 in order, and rows are kept


def _put(t: _T, i: int, value: object) -> _T:
    """``t`` with its ``i``-th field (or item) ``value``: what ``_replace`` does, at
    a fraction of its cost (the search makes millions of these)."""
    return tuple.__new__(type(t), (*t[:i], value, *t[i + 1 :]))


_MSGS = State._fields.index("msgs")
_DISPATCHERS = State._fields.index("dispatchers")
_FLIGHTS = Dispatcher._fields.index("flights")


def _set_msg(s: State, m: Msg) -> State:
    return _put(s, _MSGS, _put(s.msgs, m.id, m))


def _set_disp(s: State, d: int, disp: Dispatcher) -> State:
    return _put(s, _DISPATCHERS, _put(s.dispatchers, d, disp))


def _set_producer(s: State, p: int, producer: Producer) -> State:
    producers = list(s.producers)
    producers[p] = producer
    return s._replace(producers=tuple(producers))


def _free_slots_of(s: State, c: Config, ids: set[int], *, trim: bool = False) -> State:
    """The "slots_passed" fragment of "complete" and "rescue": the slots of these
    messages (and, with ``trim``, as in rescue, of any holder no longer running)
    each pass to a running message that holds none (listed in
    unseated_requests), lowest id first, or are free again."""
    running = {m.id for m in s.msgs if m.state == "running"}
    slots = [None if h in ids or (trim and h not in running) else h for h in s.slots]
    if s.cap is not None and Mutation.UNSEATED_NOT_COUNTED not in c.mutations:
        _seat(slots, [m for m in sorted(running) if m not in slots])
    return s._replace(slots=tuple(slots))


def _seat(slots: list[int | None], holders: list[int]) -> None:
    """The k-th of ``holders`` takes the k-th free slot, while there is one."""
    free = [n for n, holder in enumerate(slots) if holder is None]
    for n, holder in zip(free, holders, strict=False):
        slots[n] = holder


# -- producers: enqueue.sql --------------------------------------------------------


def _producers(s: State, c: Config) -> Iterator[Step]:
    for p, prod in enumerate(s.producers):
        plan = c.producers[p]
        if prod.status in ("idle", "open") and prod.written < len(plan):
            step = _enqueue(s, c, p, prod, plan[prod.written])
            if step is not None:
                yield step
        if prod.status == "open" and prod.written == len(plan):
            yield _commit(s, p, prod)
        if prod.status == "open":
            yield _rollback(s, p, prod)


def _enqueue(s: State, c: Config, p: int, prod: Producer, key: str | None) -> Step | None:
    """enqueue.sql "enqueue" (first statement: the caller's transaction begins).

    The ``ordered`` fragment: with a key, pg_advisory_xact_lock on it before
    nextval draws the id; a lock another open transaction holds makes it wait."""
    locks = prod.locks
    if key is not None and Mutation.IDS_WITHOUT_KEY_LOCK not in c.mutations:
        if any(key in o.locks for n, o in enumerate(s.producers) if n != p):
            return None  # waits for the other transaction to end
        locks = locks | {key}
    mid = len(s.msgs)  # nextval: the next id
    msg = Msg(
        mid, key, p, "open", 0, c.max_attempts, None, 0, None, frozenset(), frozenset(), False, 0
    )
    s = s._replace(msgs=(*s.msgs, msg))
    s = _set_producer(s, p, Producer("open", prod.written + 1, locks))
    return Step(f"P{p} enqueues m{mid} (key {key})", s, (), ("enqueue", p))


def _commit(s: State, p: int, prod: Producer) -> Step:
    """The caller's COMMIT: its rows become visible, its xact locks are released."""
    rank = s.commits
    broken = rules.commit_follows_ids(s, p)
    msgs = tuple(m._replace(state="ready", rank=rank) if m.producer == p else m for m in s.msgs)
    s = s._replace(msgs=msgs, commits=rank + 1)
    s = _set_producer(s, p, Producer("committed", prod.written, frozenset()))
    return Step(f"P{p} commits", s, broken, ("commit", p))


def _rollback(s: State, p: int, prod: Producer) -> Step:
    """The caller's ROLLBACK (or a deadlock victim's): its rows never existed."""
    msgs = tuple(m._replace(state="gone") if m.producer == p else m for m in s.msgs)
    s = s._replace(msgs=msgs)
    s = _set_producer(s, p, Producer("rolled back", prod.written, frozenset()))
    return Step(f"P{p} rolls back", s, (), ("rollback", p))


# -- a dispatcher: dispatchers/store/sql and dispatchers/ -----------------------------


def _dispatcher(s: State, c: Config, d: int, disp: Dispatcher) -> Iterator[Step]:
    if disp.status == "up" and len(disp.flights) < c.flights:
        for m in s.msgs:
            step = _claim(s, c, d, disp, m)
            if step is not None:
                yield step
    for i, f in enumerate(disp.flights):
        if f.phase == "claimed":
            yield _answer(s, c, d, disp, i, f, "ok")
            yield _answer(s, c, d, disp, i, f, "fail")
            if disp.status == "stopping":
                yield _answer(s, c, d, disp, i, f, "cut")
                yield _release(s, c, d, disp, i, f)
        else:
            yield _complete(s, c, d, disp, i, f)
    if disp.flights:
        yield _renew(s, c, d, disp)
    if s.crashes_left > 0:
        s2 = _set_disp(s, d, Dispatcher("crashed", ()))
        yield Step(f"D{d} crashes", s2._replace(crashes_left=s.crashes_left - 1), (), ("crash", d))
    if s.stops_left > 0 and disp.status == "up":
        s2 = _set_disp(s, d, disp._replace(status="stopping"))
        yield Step(f"D{d} is stopped", s2._replace(stops_left=s.stops_left - 1), (), ("stop", d))


def _ordering_key_free(s: State, c: Config, m: Msg) -> bool:
    """claim.sql fragment "ordering_key_free", on the claim's snapshot (rows of
    open transactions are not in it)."""
    if m.key is None:
        return True
    for other in s.msgs:
        if other.key != m.key or other.id == m.id:
            continue
        if other.state not in ("ready", "running"):  # no 'paused' in the model
            continue
        if other.id < m.id:
            return False
        if other.state == "running" and Mutation.ORDERING_WITHOUT_RUNNING_RULE not in c.mutations:
            return False
    return True


def _probe_allowed(h: Health, c: Config) -> bool:
    """claim.sql fragment "health_probes": an open breaker past its back-off,
    or a probe whose lease passed (its dispatcher vanished)."""
    if Mutation.PROBE_WHILE_PROBING in c.mutations and h.state == "probing":
        return True
    return h.blocked <= 0


def _claim(s: State, c: Config, d: int, disp: Dispatcher, m: Msg) -> Step | None:
    """claim.sql "claim" ("claim_uncapped" / "claim_lone" without a policy or a
    breaker): fragment "claimable" (ready, due, ordering_key_free), the health_*
    fragments (none open, or this claim takes the one probe: room 1), the slots of
    "policy_slots" (the lowest free one), then "claimed": running under this
    owner's lease, attempts + 1."""
    if m.state != "ready" or not _ordering_key_free(s, c, m):
        return None
    probe = False
    health = s.health
    if health is not None:
        if not _probe_allowed(health, c):
            return None
        probe = True
        health = Health("probing", d, c.lease)  # fragment "health_probed"
    slots = s.slots
    if s.cap is not None:
        if None not in slots:
            return None
        n = slots.index(None)
        slots = (*slots[:n], m.id, *slots[n + 1 :])
    broken = rules.claim_rules(s, m)
    attempt = m.attempts + 1
    s2 = _set_msg(s, m._replace(state="running", owner=d, attempts=attempt, lease=c.lease))
    s2 = s2._replace(slots=slots, health=health)
    flights = tuple(sorted((*disp.flights, Flight(m.id, attempt, "claimed", probe))))
    s2 = _set_disp(s2, d, disp._replace(flights=flights))
    kind = " as the probe" if probe else ""
    return Step(f"D{d} claims m{m.id} (attempt {attempt}){kind}", s2, broken, ("claim", d, m.id))


def _with_flight(disp: Dispatcher, i: int, f: Flight | None) -> Dispatcher:
    flights = list(disp.flights)
    if f is None:
        del flights[i]
    else:
        flights[i] = f
    return _put(disp, _FLIGHTS, tuple(sorted(flights)))


def _answer(s: State, c: Config, d: int, disp: Dispatcher, i: int, f: Flight, how: str) -> Step:
    """dispatchers.runtime.dispatcher._attempt: the request, with the message's
    Idempotency-Key, reaches the receiver, which claims the key in its inbox
    (outbox.receiver.Inbox.claim) and applies the effect the first time only;
    its answer is a 2xx or a failure to retry (or, at shutdown, the request is
    cut short before the answer). Then dispatchers.runtime.breakers.Breakers.attempted
    writes what the answer calls for: health.sql "health_close" /
    "health_reopen" for the probe (fenced by probe_owner and state 'probing'),
    "health_open" for a failure while the breaker is closed."""
    m = _msg(s, f.msg)
    broken = rules.arrival_rules(s, m, f.attempt)
    first = m.effects == 0  # the inbox has not seen the key
    m = m._replace(arrived=m.arrived | {f.attempt}, effects=m.effects + (1 if first else 0))
    s = _set_msg(s, m)
    health = s.health
    if how == "cut":
        pass  # no answer: nothing to note
    elif f.probe and health is not None and health.state == "probing" and health.owner == d:
        health = None if how == "ok" else Health("open", None, c.backoff)
    elif c.breaker and how == "fail" and not f.probe and health is None:
        health = Health("open", None, c.backoff)
    s = s._replace(health=health)
    s = _set_disp(s, d, _with_flight(disp, i, f._replace(phase=how)))
    said = {"ok": "2xx", "fail": "a failure", "cut": "no answer (cut short)"}[how]
    return Step(
        f"D{d} sends m{f.msg} (attempt {f.attempt}), gets {said}",
        s,
        broken,
        ("answer", d, f.msg, f.attempt, how),
    )


def _fenced_in(s: State, c: Config, d: int, f: Flight) -> bool:
    """The fence of "complete", "complete_delivered" and "renew": id, lease_owner,
    attempts and state 'running'."""
    m = _msg(s, f.msg)
    if m.state != "running" or m.owner != d:
        return False
    return Mutation.FENCE_WITHOUT_ATTEMPT in c.mutations or m.attempts == f.attempt


def _complete(s: State, c: Config, d: int, disp: Dispatcher, i: int, f: Flight) -> Step:
    """complete.sql "complete" / "complete_delivered": a 2xx is delivered (moved to
    history); a failure goes back to ready, or to dead once attempts are spent;
    "freed" frees the slot. A write the fence stops changes nothing."""
    write = ("complete", d, f.msg, f.attempt)
    s2 = _set_disp(s, d, _with_flight(disp, i, None))
    if not _fenced_in(s, c, d, f):
        return Step(f"D{d} writes m{f.msg}@{f.attempt}: fenced out", s2, (), write)
    m = _msg(s, f.msg)
    broken = rules.completion_rules(m, f)
    cleared = m._replace(owner=None, lease=0)
    if f.phase == "cut":  # "released" after sending: the attempt counts
        m, verdict = cleared._replace(state="ready", open=m.open | {f.attempt}), "released"
    elif f.phase == "ok":
        m, verdict = cleared._replace(state="delivered"), "delivered"
    elif f.attempt >= m.max_attempts:  # the verdict the dispatcher made from its claim
        m, verdict = cleared._replace(state="dead", ever_dead=True), "dead"
    else:
        m, verdict = cleared._replace(state="ready", open=m.open | {f.attempt}), "retry"
    s2 = _free_slots_of(_set_msg(s2, m), c, {m.id})
    return Step(f"D{d} writes m{f.msg}@{f.attempt}: {verdict}", s2, broken, write)


def _release(s: State, c: Config, d: int, disp: Dispatcher, i: int, f: Flight) -> Step:
    """complete.sql "complete" with a "released" outcome never started (a claim
    that committed after the stop signal, dispatchers.runtime.completions.released):
    ready again, the attempt refunded (attempts - 1). A released probe writes no
    health: its lease on the breaker stands."""
    release = ("release", d, f.msg, f.attempt)
    s2 = _set_disp(s, d, _with_flight(disp, i, None))
    if not _fenced_in(s, c, d, f):
        return Step(f"D{d} releases m{f.msg}@{f.attempt} unsent: fenced out", s2, (), release)
    m = _msg(s, f.msg)
    broken = rules.completion_rules(m, f)
    m = m._replace(state="ready", owner=None, lease=0, attempts=m.attempts - 1)
    s2 = _free_slots_of(_set_msg(s2, m), c, {m.id})
    return Step(f"D{d} releases m{f.msg}@{f.attempt} unsent", s2, broken, release)


def _renew(s: State, c: Config, d: int, disp: Dispatcher) -> Step:
    """leases.sql "renew": one statement for every lease the dispatcher holds,
    fenced as "complete"; the heartbeat drops each flight it did not return."""
    kept = []
    for f in disp.flights:
        if _fenced_in(s, c, d, f):
            s = _set_msg(s, _msg(s, f.msg)._replace(lease=c.lease))
            kept.append(f)
    s = _set_disp(s, d, disp._replace(flights=tuple(kept)))
    lost = len(disp.flights) - len(kept)
    return Step(f"D{d} renews its leases ({lost} lost)", s, (), ("renew", d))


# -- the clock, maintenance and operators --------------------------------------------


def _maintenance(s: State, c: Config) -> Iterator[Step]:
    if not any(
        f.phase == "claimed" for d in s.dispatchers if d.status != "crashed" for f in d.flights
    ):
        yield _tick(s)
    if any(m.state == "running" and m.lease < 0 for m in s.msgs):
        yield _rescue(s, c)
    if s.cap_step < len(c.cap_plan):
        yield _set_cap(s, c, c.cap_plan[s.cap_step])
    if s.retries_left > 0:
        for m in s.msgs:
            if m.state == "dead":
                yield _dead_retry(s, m)


def _tick(s: State) -> Step:
    """now() moves on: leases run out, an open breaker's back-off passes."""
    msgs = tuple(
        m._replace(lease=max(m.lease - 1, -1)) if m.state == "running" else m for m in s.msgs
    )
    health = s.health
    if health is not None:
        health = health._replace(blocked=max(health.blocked - 1, 0))
    return Step("tick", s._replace(msgs=msgs, health=health), (), ("tick",))


def _rescue(s: State, c: Config) -> Step:
    """complete.sql "rescue": running rows whose lease_until < now() go back to
    ready, or dead when their attempts are spent; "freed" frees their slots and
    any slot whose holder no longer runs."""
    msgs = []
    for m in s.msgs:
        if m.state == "running" and m.lease < 0:
            state = "dead" if m.attempts >= m.max_attempts else "ready"
            m = m._replace(
                state=state,
                owner=None,
                lease=0,
                open=m.open | {m.attempts},
                ever_dead=m.ever_dead or state == "dead",
            )
        msgs.append(m)
    rescued = _free_slots_of(s._replace(msgs=tuple(msgs)), c, set(), trim=True)
    return Step("rescue", rescued, (), ("rescue",))


def _set_cap(s: State, c: Config, cap: int) -> Step:
    """slots.sql fragment "slots_synced" (endpoint_slots_sync /
    destination_slots_sync): slots added up to the cap, those above it deleted,
    their holders (by id) moved to the free slots kept (by slot), while any are
    ("cap_reseated"), then the running messages that held none before; the rest
    are listed in unseated_requests ("cap_listed": in the model, every running
    message that holds no slot is on that list)."""
    kept = list(s.slots[:cap]) + [None] * max(0, cap - len(s.slots))
    if Mutation.CAP_LOWERED_WITHOUT_RESEAT not in c.mutations:
        _seat(kept, sorted(h for h in s.slots[cap:] if h is not None))
    if Mutation.UNSEATED_NOT_COUNTED not in c.mutations:
        running = (m.id for m in s.msgs if m.state == "running")
        _seat(kept, [m for m in running if m not in s.slots])
    s = s._replace(slots=tuple(kept), cap=cap, cap_step=s.cap_step + 1)
    return Step(f"the cap is set to {cap}", s, (), ("cap", cap))


def _dead_retry(s: State, m: Msg) -> Step:
    """admin.sql "dead_retry": a dead message is ready again with one more
    attempt in its budget, its id (and so its place in its key's order) kept."""
    m = m._replace(state="ready", max_attempts=m.attempts + 1, open=m.open | m.arrived)
    s = _set_msg(s, m)._replace(retries_left=s.retries_left - 1)
    return Step(f"an operator retries dead m{m.id}", s, (), ("retry", m.id))
