"""Destination policies and health: caps measured at the receiver, rate limits
on the claims, breakers that let one probe through at a time.

A policy change takes effect at its commit, somewhere between the harness's
``before`` and ``after`` stamps; a statement sees the version committed before
its snapshot, taken between its transaction's start (``now()``) and the audit's
clock inside it. Where the two windows meet, every version that may have been
seen is allowed: the bounds below are the loosest the protocol permits, never
looser.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from tests.history.checks.facts import Facts, show_lease, show_tie, when
from tests.history.history import INF, HealthEvent, PolicyChange
from tests.history.leases import Lease, Tie
from tests.history.violation import CAP_CHANGE_DEFECT, Violation


@dataclass(frozen=True)
class Version:
    """A policy as it may have been in force from ``lo`` to ``hi``."""

    cap: int | None
    rate: float | None
    burst: int | None
    lo: float
    hi: float
    change: PolicyChange


def versions(f: Facts, name: str) -> list[Version]:
    changes = sorted(
        (p for p in f.history.policies if p.destination == name), key=lambda p: p.before
    )
    out = []
    for i, p in enumerate(changes):
        hi = changes[i + 1].after if i + 1 < len(changes) else INF
        lo = -INF if i == 0 else p.before
        out.append(Version(p.cap, p.rate, p.burst, lo, hi, p))
    return out


def _in_force(listed: list[Version], lo: float, hi: float) -> list[Version]:
    return [v for v in listed if v.lo <= hi and lo <= v.hi]


@dataclass(frozen=True)
class Flight:
    tie: Tie
    lease: Lease
    start: float
    stop: float


def in_flight(f: Facts, name: str) -> list[Flight]:
    """The requests at ``name`` sent by a running lease, each in flight from its
    arrival until the earliest of: its end at the receiver, the sender's request
    timeout (counted from the arrival, after the sender started it), and the end
    of its lease (its slot was freed then at the latest)."""
    timeout = f.history.timing.request_timeout
    out = []
    for t in f.ties_at(name):
        lease = t.lease
        if lease is None or t.late:
            continue
        r = t.request
        stop = min(r.end, r.arrival + timeout, lease.finish)
        if stop > r.arrival:
            out.append(Flight(t, lease, r.arrival, stop))
    return sorted(out, key=lambda x: x.start)


def cap_at_receiver(f: Facts) -> list[Violation]:
    """At no moment more requests in flight at a capped destination, as its
    receiver saw them, than the cap (model: ``claim_rules``). Of the requests in
    flight together, the last to take its slot did so while all of them held
    one, under a cap in force between the latest start of their claims'
    transactions and the latest of their claims."""
    out: list[Violation] = []
    for d in f.history.destinations:
        listed = versions(f, d.name)
        caps = [v.cap for v in listed]
        if not listed or all(c is None for c in caps):
            continue
        least = min(c for c in caps if c is not None)
        flights = in_flight(f, d.name)
        reported: set[frozenset[int]] = set()
        for x in flights:
            together = [y for y in flights if y.start <= x.start < y.stop]
            if len(together) <= least:
                continue
            lo = max(y.lease.claim_txn_start for y in together)
            hi = max(y.lease.claimed_at for y in together)
            allowed = [v.cap for v in _in_force(listed, lo, hi)]
            if not allowed or None in allowed:
                continue
            cap = max(c for c in allowed if c is not None)
            group = frozenset(id(y) for y in together)
            if len(together) <= cap or group in reported:
                continue
            reported.add(group)
            out.append(
                Violation(
                    "cap_at_receiver",
                    f"{d.name}: {len(together)} requests in flight at {when(x.start)} under a "
                    f"cap of {cap} (in force between {when(lo)} and {when(hi)})",
                    (
                        *(show_tie(y.tie) for y in together),
                        *(
                            f"cap {v.cap} set {when(v.change.before)}..{when(v.change.after)}"
                            for v in listed
                        ),
                        *_slots(f, d.destination, lo - 1.0, hi),
                    ),
                    known=_cap_change_defect(f, d.destination, listed, lo, hi),
                )
            )
    return out


def _slots(f: Facts, destination: str, lo: float, hi: float) -> list[str]:
    """The claims, lease ends and slot changes at ``destination`` between ``lo``
    and ``hi``, in order: what shows how a cap was exceeded."""
    lines: list[tuple[float, str]] = []
    for lease in f.leases_at(destination):
        if lo <= lease.claimed_at <= hi:
            lines.append((lease.claimed_at, f"claim m{lease.message_id} by {lease.app}"))
        if lease.ended_at is not None and lo <= lease.ended_at <= hi:
            lines.append((lease.ended_at, f"end m{lease.message_id} ({lease.end})"))
    for e in f.history.slot_events:
        if e.destination == destination and lo <= e.at <= hi:
            what = "unseated list" if e.slot == 0 else f"slot {e.slot}"
            lines.append(
                (e.at, f"{what} {e.op}: {e.old_holder} -> {e.new_holder} by {e.app} xid {e.xid}")
            )
    return [f"{when(t)} {line}" for t, line in sorted(lines)]


def _cap_change_defect(
    f: Facts, destination: str, listed: list[Version], lo: float, hi: float
) -> str | None:
    """The known defect, when a request claimed before a cap change (not the
    first policy) was still running at the claim that exceeded the cap."""
    changes = [v.change for v in listed[1:] if v.change.before <= hi]
    for lease in f.leases_at(destination):
        for change in changes:
            if lease.claimed_at < change.after and lease.finish > lo:
                return CAP_CHANGE_DEFECT
    return None


RESOLUTION = 2e-6
"""Seconds two database timestamps of one window may be off by: each is rounded
to the microsecond."""


def rate_within_limit(f: Facts) -> list[Violation]:
    """A rate-limited destination's starts (its claims: a request counts once it
    is claimed, whatever its outcome) stay within burst + rate x window in every
    window, timed by the claims' now(), which the rate slots compare against."""
    out = []
    for d in f.history.destinations:
        listed = versions(f, d.name)
        if not any(v.rate is not None for v in listed):
            continue
        starts = sorted(lease.claim_txn_start for lease in f.leases_at(d.destination))
        worst: tuple[float, int, int, float] | None = None
        for i, a in enumerate(starts):
            for j in range(i, len(starts)):
                b = starts[j]
                inside = _in_force(listed, a, b)
                if any(v.rate is None or v.burst is None for v in inside):
                    continue
                # each end read to the microsecond (timestamptz), and the slots' next_at
                # rounded so too: a claim exactly on a slot's boundary may read up to
                # RESOLUTION early
                bound = sum(
                    (v.burst or 0)
                    + (v.rate or 0) * (max(0.0, min(b, v.hi) - max(a, v.lo)) + RESOLUTION)
                    for v in inside
                )
                excess = (j - i + 1) - bound
                # the widest window wins a tie (the first found, up to float error)
                if excess > 1e-6 and (worst is None or excess > worst[0] + 1e-9):
                    worst = (excess, i, j, bound)
        if worst is not None:
            _, i, j, bound = worst
            out.append(
                Violation(
                    "rate_within_limit",
                    f"{d.name}: {j - i + 1} claims from {when(starts[i])} to {when(starts[j])} "
                    f"({starts[j] - starts[i]:.3f} s), above the bound of {bound:.2f}",
                    tuple(
                        f"rate {v.rate}/s burst {v.burst} set {when(v.change.before)}.."
                        f"{when(v.change.after)}"
                        for v in listed
                    ),
                )
            )
    return out


def _health_by_destination(f: Facts) -> dict[str, list[HealthEvent]]:
    out: dict[str, list[HealthEvent]] = defaultdict(list)
    for e in sorted(f.history.health_events, key=lambda e: e.seq):
        out[e.destination].append(e)
    return out


def _probe_xids(f: Facts) -> set[tuple[str, int]]:
    return {(e.destination, e.xid) for e in f.history.health_events if e.new_state == "probing"}


def _blocking(state: str | None, blocked_until: float | None, now: float) -> bool:
    if state in ("open", "probing"):
        return True
    return state == "held" and blocked_until is not None and blocked_until > now


def claims_respect_breaker(f: Facts) -> list[Violation]:
    """No claim takes a message of a destination whose breaker is open (or
    probing), or whose hold runs, except the claim that takes the probe. The
    changes of one health row are serialised by its lock, so change k commits
    before change k + 1 is recorded: a claim may have seen any version recorded
    before its clock and not superseded before its transaction started, and is
    wrong only if every one of them blocked it."""
    out = []
    probes = _probe_xids(f)
    for destination, events in _health_by_destination(f).items():
        states: list[tuple[float, str | None, float | None]] = [(-INF, None, None)]
        states += [(e.at, e.new_state, e.new_blocked_until) for e in events]
        ats = [s[0] for s in states] + [INF, INF]
        for lease in f.leases_at(destination):
            if (destination, lease.xid) in probes:
                continue
            seen = [
                s
                for k, s in enumerate(states)
                if ats[k] < lease.claimed_at and lease.claim_txn_start < ats[k + 2]
            ]
            if seen and all(_blocking(s[1], s[2], lease.claim_txn_start) for s in seen):
                out.append(
                    Violation(
                        "claims_respect_breaker",
                        f"{destination}: m{lease.message_id} claimed at {when(lease.claimed_at)} "
                        f"while its health row said {[s[1] for s in seen]}",
                        (
                            show_lease(lease),
                            *(
                                f"health {s[1]} recorded {when(s[0])} until {when(s[2])}"
                                for s in seen
                            ),
                        ),
                    )
                )
    return out


def one_probe_at_a_time(f: Facts) -> list[Violation]:
    """An open breaker lets exactly one probe through at a time (model:
    ``state_rules``, "probes of an open breaker in flight at once": a probe is in
    flight until its answer is known). The claim that takes a probe claims one
    message of its destination, from an open row past its back-off, or from a
    probing row whose prober's lease on it ran out; and no two probe requests are
    at the receiver at once, unless the first one's sender had stopped (its lease
    ran out). A probe whose answer was written (the row open again) while its
    message's outcome was not yet (its dispatcher frozen) is no longer in flight."""
    out = []
    leases_by_xid: dict[tuple[str, int], list[Lease]] = defaultdict(list)
    for leases in f.leases.values():
        for lease in leases:
            leases_by_xid[(lease.destination, lease.xid)].append(lease)
    probe_leases: dict[str, list[Lease]] = defaultdict(list)
    for e in f.history.health_events:
        if e.new_state != "probing":
            continue
        taken = leases_by_xid.get((e.destination, e.xid), [])
        if len(taken) != 1:
            out.append(
                Violation(
                    "one_probe_at_a_time",
                    f"{e.destination}: the claim that took a probe (xid {e.xid}) claimed "
                    f"{len(taken)} of its messages",
                    tuple(show_lease(lease) for lease in taken),
                )
            )
        if e.old_state not in ("open", "probing") or (
            e.old_blocked_until is not None and e.old_blocked_until > e.txn_start
        ):
            out.append(
                Violation(
                    "one_probe_at_a_time",
                    f"{e.destination}: a probe taken at {when(e.txn_start)} from state "
                    f"{e.old_state} blocked until {when(e.old_blocked_until)}",
                    tuple(show_lease(lease) for lease in taken),
                )
            )
        probe_leases[e.destination].extend(taken)
    name_of = {d.destination: d.name for d in f.history.destinations}
    for destination, leases in probe_leases.items():
        ids = {id(lease) for lease in leases}
        flights = [x for x in in_flight(f, name_of.get(destination, "")) if id(x.lease) in ids]
        for i, first in enumerate(flights):
            for second in flights[i + 1 :]:
                if second.start < first.stop and not _expired(
                    first.lease, second.lease.claim_txn_start
                ):
                    out.append(
                        Violation(
                            "one_probe_at_a_time",
                            f"{destination}: two probe requests at the receiver at once",
                            (show_tie(first.tie), show_tie(second.tie)),
                        )
                    )
    return out


def _expired(lease: Lease, now: float) -> bool:
    """Whether ``lease`` had run out by ``now`` (its last renewal recorded before
    then set a time already past): its holder had stopped, and another may probe."""
    return lease.lease_until_before(now) < now
