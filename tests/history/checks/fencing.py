"""Fencing: no write by an owner whose lease was taken over.

The audit names the session of every write, and so its process. A lease is
renewed and ended only by the process that claimed it, or ended by a rescue once
it ran out; a row nobody leases is written only by its producer (and by the
pause of a disabled endpoint's messages), or moved back by an operator's replay
or dead retry (the recorded command's own transaction, naming the message, its
attempts kept). The attempts table agrees: one row per attempt sent, written by
that attempt's owner, or by the rescuer for a lease that ran out; a settled
message has attempts 1..N, the last its final outcome, and a final outcome
before it only where an operator moved the message back. A dispatcher gives a
lease up as lost (its write fenced out) only once another ended it.
"""

from __future__ import annotations

from collections import defaultdict

from tests.history.checks.facts import Facts, Reopen, show_lease, when
from tests.history.history import AttemptRow
from tests.history.leases import Lease
from tests.history.violation import Violation

COMPLETED = ("delivered", "ready", "dead", "paused")
"""How a lease ends by its own outcome (``released`` too, when it was sent)."""
FINAL = {"delivered": ("delivered",), "dead": ("failed", "gone", "retry", "lease_expired")}
"""The outcome of a settled message's last attempt row, by its state."""


def completion_fenced(f: Facts) -> list[Violation]:
    """Every write of a leased row is its owner's (renew, complete, release) or a
    rescue of a lease that ran out; no write lands on a row its writer does not
    lease (model: ``completion_rules``)."""
    out = []
    for leases in f.leases.values():
        for lease in leases:
            out.extend(_lease_writes(lease))
    reopens = {r.event.seq: r for r in f.reopens}
    for e in f.others:
        first = f.inserts.get(e.id)
        if first is not None and first.seq == e.seq:
            continue
        if e.old_state == "ready" and e.new_state == "paused":
            continue
        if e.seq in reopens:
            out.extend(_reopen(f, reopens[e.seq]))
            continue
        out.append(
            Violation(
                "completion_fenced",
                f"m{e.id} changed ({e.op} {e.old_state}->{e.new_state}, attempts "
                f"{e.old_attempts}->{e.new_attempts}) at {when(e.at)} by {e.app}, "
                "which held no lease on it",
            )
        )
    out.extend(_attempt_rows(f))
    out.extend(_given_up(f))
    return out


def _reopen(f: Facts, r: Reopen) -> list[Violation]:
    """A message moved back by the recorded command that named it, in that
    command's transaction, its attempts kept."""
    e = r.event
    commands = [
        op
        for op in f.history.operations
        if op.kind == r.kind and op.xid == e.xid and e.id in op.ids
    ]
    if r.kind == "replay":  # back from delivered, as its last lease left it
        ended = [x for x in f.leases.get(e.id, []) if x.end_seq is not None and x.end_seq < e.seq]
        kept = bool(ended) and ended[-1].end == "delivered" and ended[-1].attempt == r.attempt
    else:
        kept = e.old_attempts == e.new_attempts
    if commands and kept:
        return []
    what = "replayed (inserted again)" if r.kind == "replay" else "moved from dead to ready"
    return [
        Violation(
            "completion_fenced",
            f"m{e.id} was {what} at {when(e.at)} by {e.app} (xid {e.xid}), "
            + ("its attempts not kept" if commands else f"which no operator's {r.kind} was"),
        )
    ]


def _given_up(f: Facts) -> list[Violation]:
    """Each lease a dispatcher logged as lost (``lease_lost``: its renewal or its
    outcome fenced out, or claimed again) had ended by another's hand: a rescue."""
    out = []
    for p in f.history.processes:
        for mid, attempt, reason in p.lost:
            leases = [
                x for x in f.leases.get(mid, []) if x.attempt == attempt and x.owner == p.owner
            ]
            if not any(x.end in ("rescued", "taken") for x in leases):
                out.append(
                    Violation(
                        "completion_fenced",
                        f"{p.name} gave m{mid}@{attempt} up ({reason}) though no other "
                        "ended its lease",
                        tuple(show_lease(x) for x in leases),
                    )
                )
    return out


def _lease_writes(lease: Lease) -> list[Violation]:
    out = []
    for seq, app in lease.renewals:
        if app != lease.app:
            out.append(
                Violation(
                    "completion_fenced",
                    f"{app} renewed a lease of {lease.app} (event {seq})",
                    (show_lease(lease),),
                )
            )
    if lease.end == "taken":
        out.append(
            Violation(
                "completion_fenced",
                f"m{lease.message_id} changed owner while running, without a rescue",
                (show_lease(lease),),
            )
        )
    elif lease.end == "rescued":
        until, now = lease.lease_until_at_end, lease.end_txn_start
        if until is None or now is None or not until < now:
            out.append(
                Violation(
                    "completion_fenced",
                    f"m{lease.message_id}'s lease was rescued at {when(now)} though it ran "
                    f"until {when(until)}",
                    (show_lease(lease),),
                )
            )
    elif lease.end != "running" and lease.end_app != lease.app:
        out.append(
            Violation(
                "completion_fenced",
                f"{lease.end_app} wrote the outcome ({lease.end}) of a lease {lease.app} held: "
                "a write by an owner whose lease was taken over",
                (show_lease(lease),),
            )
        )
    return out


def _attempt_rows(f: Facts) -> list[Violation]:
    h = f.history
    out = []
    rows: dict[int, dict[int, AttemptRow]] = defaultdict(dict)
    for row in h.attempts:
        rows[row.message_id][row.attempt] = row
        sent = [x for x in f.leases.get(row.message_id, []) if x.sent and x.attempt == row.attempt]
        lease = sent[-1] if sent else None
        if lease is None:
            out.append(
                Violation(
                    "completion_fenced",
                    f"attempt row m{row.message_id}@{row.attempt} ({row.outcome}, {row.owner}) "
                    "has no sent lease of that attempt",
                )
            )
        elif row.owner != lease.owner:
            out.append(
                Violation(
                    "completion_fenced",
                    f"attempt row m{row.message_id}@{row.attempt} ({row.outcome}) names "
                    f"{row.owner}, but {lease.owner} held that attempt",
                    (show_lease(lease),),
                )
            )
        elif (row.outcome == "lease_expired") != (lease.end == "rescued"):
            out.append(
                Violation(
                    "completion_fenced",
                    f"attempt row m{row.message_id}@{row.attempt} says {row.outcome}, but the "
                    f"lease ended as {lease.end}",
                    (show_lease(lease),),
                )
            )
    for leases in f.leases.values():
        for lease in leases:
            ended = lease.end in (*COMPLETED, "released", "rescued")
            if ended and lease.sent and lease.attempt not in rows.get(lease.message_id, {}):
                later = [
                    x
                    for x in f.leases[lease.message_id]
                    if x.attempt == lease.attempt and x.claim_seq > lease.claim_seq
                ]
                if not later:
                    out.append(
                        Violation(
                            "completion_fenced",
                            f"m{lease.message_id}@{lease.attempt} ended as {lease.end} with no "
                            "attempt row",
                            (show_lease(lease),),
                        )
                    )
    for m in h.finals:
        if m.state not in FINAL:
            continue
        numbers = sorted(rows.get(m.id, {}))
        if numbers != list(range(1, m.attempts + 1)):
            out.append(
                Violation(
                    "completion_fenced",
                    f"m{m.id} ({m.state}, {m.attempts} attempts) has attempt rows {numbers}",
                )
            )
            continue
        outcome = rows[m.id][m.attempts].outcome
        if outcome not in FINAL[m.state]:
            out.append(
                Violation(
                    "completion_fenced",
                    f"m{m.id} is {m.state} but its last attempt row says {outcome}",
                )
            )
        reopened = f.reopened_at(m.id)
        earlier = [rows[m.id][n].outcome for n in numbers[:-1] if n not in reopened]
        if "delivered" in earlier or "failed" in earlier:
            out.append(
                Violation(
                    "completion_fenced",
                    f"m{m.id} has a final outcome before its last attempt: {earlier}",
                )
            )
    return out
