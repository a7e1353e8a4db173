"""The delivery contract as checks on the model's states and steps.

Each check returns the rules broken, as sentences (an empty tuple: none). State
checks (:func:`state_rules`) hold in every reachable state; step checks hold of
the step that makes them (a claim, a request's arrival, a completion, a commit);
:func:`settled` is the goal every reachable state must still be able to reach
(:mod:`tests.model.explore` checks that over the whole graph).

In flight at the destination means running rows: what the slots admit and
count. A request whose lease ended without a recorded outcome may still be out
there; that is the duplicate the contract allows, checked as such.
"""

from __future__ import annotations

from tests.model.state import Flight, Msg, State


def state_rules(s: State) -> tuple[str, ...]:
    """What must hold in every reachable state."""
    broken = []
    running_keys = [m.key for m in s.msgs if m.state == "running" and m.key is not None]
    if len(running_keys) != len(set(running_keys)):
        broken.append("two messages of one ordering key are in flight at once")
    for m in s.msgs:
        if m.effects > 1:
            broken.append(f"the inbox applied m{m.id}'s key {m.effects} times")
        decided = m.arrived - m.open
        if len(decided) > 1:
            broken.append(
                f"m{m.id} reached the receiver again (attempts {sorted(m.arrived)}) though no "
                "lease ended without an outcome and no outcome asked for it"
            )
    probes = [
        f
        for d in s.dispatchers
        if d.status != "crashed"
        for f in d.flights
        if f.probe and f.phase == "claimed"
    ]
    if len(probes) > 1:
        broken.append(f"{len(probes)} probes of an open breaker are in flight at once")
    return tuple(broken)


def commit_follows_ids(s: State, producer: int) -> tuple[str, ...]:
    """At a commit: the ids of each ordering key follow commit order, so every
    message of a key committed before has a smaller id than this one's."""
    broken = []
    for m in s.msgs:
        if m.producer != producer or m.key is None:
            continue
        later = [o.id for o in s.msgs if o.key == m.key and o.rank is not None and o.id > m.id]
        if later:
            broken.append(
                f"m{m.id} of key {m.key} commits after m{later[0]}, which has a larger id"
            )
    return tuple(broken)


def claim_rules(s: State, m: Msg) -> tuple[str, ...]:
    """At a claim: only a committed message is claimed, and no claim starts while
    the destination has its cap's worth in flight (the cap in force: a change is
    one statement, settled once it commits)."""
    broken = []
    if m.rank is None:
        broken.append(f"m{m.id} is claimed though its transaction did not commit")
    running = sum(1 for o in s.msgs if o.state == "running")
    if s.cap is not None and running >= s.cap:
        broken.append(
            f"m{m.id} is claimed while {running} requests are in flight under a cap of {s.cap}"
        )
    return tuple(broken)


def arrival_rules(s: State, m: Msg, attempt: int) -> tuple[str, ...]:
    """When a request reaches the receiver: nothing rolled back is sent, and a
    message first arrives only after every message of its key committed before
    it arrived or went dead (a dead one holds no successor back)."""
    broken = []
    if m.rank is None:
        broken.append(f"m{m.id} is sent though its transaction did not commit")
        return tuple(broken)
    if m.arrived or m.key is None:
        return tuple(broken)
    for o in s.msgs:
        if o.key != m.key or o.rank is None or (o.rank, o.id) >= (m.rank, m.id):
            continue
        if not o.arrived and not o.ever_dead:
            broken.append(
                f"m{m.id} (commit #{m.rank}) reaches the receiver before m{o.id} "
                f"(commit #{o.rank}) of key {m.key}"
            )
    return tuple(broken)


def completion_rules(m: Msg, f: Flight) -> tuple[str, ...]:
    """When a completion applies: it is the current claim's (the fence), never an
    owner's whose lease was taken over, even by itself."""
    if m.attempts != f.attempt:
        return (f"a write of m{m.id}'s attempt {f.attempt} applied to its attempt {m.attempts}",)
    return ()


def settled(s: State) -> bool:
    """Every committed message is delivered or dead."""
    return all(m.state in ("delivered", "dead") for m in s.msgs if m.rank is not None)
