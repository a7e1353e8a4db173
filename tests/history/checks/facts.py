"""What every check reads: the history, its leases, its requests tied to them and
the messages an operator moved back, derived once; and small helpers to word the
evidence."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tests.history.history import History, MessageEvent, Txn
from tests.history.leases import Lease, Tie, leases_of, match_requests


@dataclass(frozen=True)
class Reopen:
    """A settled message moved back to be sent again, as the audit shows it: a
    ``replay`` (its row back from the delivered history, a second insert of its
    id) or a ``dead_retry`` (dead to ready, or paused). Either keeps the id, the
    key and ``attempts`` (attempt numbers never repeat)."""

    kind: str
    message_id: int
    attempt: int  # its attempts when moved back
    event: MessageEvent


def reopens_of(events: Iterable[MessageEvent]) -> list[Reopen]:
    out = []
    inserted: set[int] = set()
    for e in sorted(events, key=lambda e: e.seq):
        if e.op == "insert":
            if e.id in inserted:
                out.append(Reopen("replay", e.id, e.new_attempts or 0, e))
            inserted.add(e.id)
        elif e.op == "update" and e.old_state == "dead" and e.new_state in ("ready", "paused"):
            out.append(Reopen("dead_retry", e.id, e.new_attempts or 0, e))
    return out


@dataclass(frozen=True)
class Facts:
    history: History
    leases: dict[int, list[Lease]]
    others: list[MessageEvent]  # changes of rows no lease held (inserts, ...)
    ties: list[Tie]
    inserts: dict[int, MessageEvent] = field(default_factory=dict)  # id -> its first insert
    txn_by_xid: dict[int, Txn] = field(default_factory=dict)
    reopens: list[Reopen] = field(default_factory=list)

    def reopened_at(self, message_id: int) -> set[int]:
        """The attempts at which an operator moved ``message_id`` back."""
        return {r.attempt for r in self.reopens if r.message_id == message_id}

    def leases_at(self, destination: str) -> list[Lease]:
        """Every lease of a message of ``destination``, in claim order."""
        found = [lease for ls in self.leases.values() for lease in ls]
        return sorted(
            (lease for lease in found if lease.destination == destination),
            key=lambda lease: lease.claim_seq,
        )

    def ties_at(self, name: str) -> list[Tie]:
        return [t for t in self.ties if t.request.destination == name]

    def requests_of(self) -> dict[int, list[Tie]]:
        """Message id -> its requests, by arrival."""
        out: dict[int, list[Tie]] = defaultdict(list)
        for t in sorted(self.ties, key=lambda t: t.request.arrival):
            if t.message_id is not None:
                out[t.message_id].append(t)
        return out

    def ordering_keys(self) -> dict[int, str]:
        keys = {m.id: m.ordering_key for m in self.history.finals if m.ordering_key}
        for mid, e in self.inserts.items():
            if e.ordering_key:
                keys.setdefault(mid, e.ordering_key)
        return keys


def facts(history: History) -> Facts:
    leases, others = leases_of(history.message_events)
    inserts: dict[int, MessageEvent] = {}
    for e in sorted(history.message_events, key=lambda e: e.seq):
        if e.op == "insert":
            inserts.setdefault(e.id, e)  # a replay inserts the id again
    return Facts(
        history=history,
        leases=leases,
        others=others,
        ties=match_requests(history, leases),
        inserts=inserts,
        txn_by_xid={t.xid: t for t in history.txns if t.xid is not None},
        reopens=reopens_of(history.message_events),
    )


def when(t: float | None) -> str:
    """A time as the dispatchers' logs show it (UTC), to the millisecond."""
    if t is None:
        return "-"
    if t == float("inf"):
        return "never"
    return time.strftime("%H:%M:%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}"


def show_lease(lease: Lease) -> str:
    return (
        f"lease m{lease.message_id}@{lease.attempt} owner={lease.owner} ({lease.app}) "
        f"claimed {when(lease.claimed_at)} (txn {when(lease.claim_txn_start)}, xid {lease.xid}) "
        f"ended {when(lease.ended_at)} as {lease.end}"
        + (f" by {lease.end_app}" if lease.end_app else "")
    )


def show_tie(tie: Tie) -> str:
    r = tie.request
    lease = (
        f" <- m{tie.message_id}@{tie.lease.attempt} ({tie.lease.app})"
        if tie.lease is not None
        else f" <- m{tie.message_id} (no lease)"
    )
    return (
        f"request to {r.destination} key={r.key} arrived {when(r.arrival)} ended "
        f"{when(r.end)} ({r.end_kind}, status {r.status}, {r.behavior}"
        + (f", {r.effect}" if r.effect else "")
        + f", conn {r.connection}){lease}"
    )
