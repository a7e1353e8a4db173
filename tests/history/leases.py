"""The history read as leases, and each request tied to the lease that sent it.

A :class:`Lease` is one claim of a message, from the statement that claimed it to
the one that ended it (a completion, a release, a rescue), with the renewals in
between, read from the audit of ``messages`` (:mod:`tests.history.audit`).

A request is tied to a message by its idempotency key and destination, and to a
lease by a matching (:func:`match_requests`): a lease sends at most one request;
the request arrives after the claim (the claim commits before anything is sent);
and before the lease ended, unless the lease ended without an HTTP answer (a
timeout, a lost connection, a lease that ran out, a request cut at shutdown),
since then the request may still have been on its way. A request that no lease
can account for is a request sent twice by one attempt, or sent by no attempt.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from tests.history.history import AttemptRow, History, MessageEvent, Request

RESCUED = "lease expired"
"""How the rescuer's last_error begins (dispatchers/store/sql/complete.sql, "rescue")."""


@dataclass(frozen=True)
class Lease:
    message_id: int
    destination: str
    attempt: int
    owner: str
    app: str  # the claimer's session (its process)
    xid: int
    claimed_at: float  # clock time inside the claim statement
    claim_txn_start: float  # now() of the claim: what rate slots and health compare with
    claim_seq: int
    ended_at: float | None = None  # None: still running when the history was taken
    end: str = "running"  # delivered | ready | dead | paused | released | rescued | taken
    end_app: str | None = None
    end_txn_start: float | None = None
    end_seq: int | None = None
    lease_until_at_end: float | None = None
    sent: bool = True  # False when its end refunded the attempt (released unsent)
    renewals: tuple[tuple[int, str], ...] = ()  # (seq, app) of each renewal
    untils: tuple[tuple[float, float], ...] = ()  # (when, lease_until) set by claim, renewals

    @property
    def finish(self) -> float:
        return float("inf") if self.ended_at is None else self.ended_at

    def lease_until_before(self, t: float) -> float:
        """The lease's deadline as the last write recorded before ``t`` set it."""
        until = self.untils[0][1] if self.untils else float("inf")
        for at, value in self.untils:
            if at < t:
                until = value
        return until


def leases_of(events: Iterable[MessageEvent]) -> tuple[dict[int, list[Lease]], list[MessageEvent]]:
    """Each message's leases in order, and the events that belong to no lease and
    are no claim (inserts, and any other change of a row that was not running)."""
    leases: dict[int, list[Lease]] = defaultdict(list)
    others: list[MessageEvent] = []
    current: dict[int, Lease] = {}
    for e in sorted(events, key=lambda e: e.seq):
        held = current.get(e.id)
        if e.op == "update" and e.old_state != "running" and e.new_state == "running":
            current[e.id] = _claim(e)
            continue
        if held is None:
            others.append(e)
            continue
        if e.op == "update" and e.new_state == "running":
            if e.new_owner == held.owner and e.new_attempts == held.attempt:
                current[e.id] = _renewed(held, e)
                continue
            # the lease changed hands without ever leaving 'running'
            leases[e.id].append(_ended(held, e, "taken"))
            current[e.id] = _claim(e)
            continue
        if e.op == "delete":
            how = "delivered"
        elif (e.last_error or "").startswith(RESCUED):
            how = "rescued"
        elif (
            e.new_attempts is not None
            and e.old_attempts is not None
            and (e.new_attempts < e.old_attempts)
        ):
            how = "released"
        else:
            how = e.new_state or "?"
        leases[e.id].append(_ended(held, e, how))
        del current[e.id]
    for mid, held in current.items():
        leases[mid].append(held)
    return dict(leases), others


def _claim(e: MessageEvent) -> Lease:
    return Lease(
        message_id=e.id,
        destination=e.destination or "",
        attempt=e.new_attempts or 0,
        owner=e.new_owner or "",
        app=e.app,
        xid=e.xid,
        claimed_at=e.at,
        claim_txn_start=e.txn_start,
        claim_seq=e.seq,
        untils=((e.at, e.new_lease_until),) if e.new_lease_until is not None else (),
    )


def _renewed(lease: Lease, e: MessageEvent) -> Lease:
    untils = lease.untils
    if e.new_lease_until is not None:
        untils = (*untils, (e.at, e.new_lease_until))
    return replace(lease, renewals=(*lease.renewals, (e.seq, e.app)), untils=untils)


def _ended(lease: Lease, e: MessageEvent, how: str) -> Lease:
    return replace(
        lease,
        ended_at=e.at,
        end=how,
        end_app=e.app,
        end_txn_start=e.txn_start,
        end_seq=e.seq,
        lease_until_at_end=e.old_lease_until,
        sent=how != "released",
    )


def attempt_rows(history: History) -> dict[tuple[int, int], AttemptRow]:
    return {(a.message_id, a.attempt): a for a in history.attempts}


def answered(lease: Lease, rows: dict[tuple[int, int], AttemptRow]) -> bool:
    """Whether the lease's request got an HTTP answer that its owner recorded:
    then the request arrived before the lease ended."""
    if lease.end in ("running", "rescued", "released", "taken"):
        return False
    row = rows.get((lease.message_id, lease.attempt))
    return row is not None and row.owner == lease.owner and row.status is not None


def message_ids(history: History) -> dict[tuple[str, str], int]:
    """(target, idempotency key) -> message id, for every message written."""
    ids = {(m.target, m.idempotency_key): m.id for m in history.finals}
    for e in history.message_events:
        if e.op == "insert" and e.target is not None and e.idempotency_key is not None:
            ids.setdefault((e.target, e.idempotency_key), e.id)
    return ids


@dataclass(frozen=True)
class Tie:
    """A request, the message it belongs to, and the lease that sent it."""

    request: Request
    message_id: int | None
    lease: Lease | None

    @property
    def late(self) -> bool:
        """Sent by a lease that had already ended (its request was on its way)."""
        return self.lease is not None and self.request.arrival > self.lease.finish


def match_requests(history: History, leases: dict[int, list[Lease]]) -> list[Tie]:
    """Tie each request to its message and to a lease that can account for it (see
    the module's docstring); a request no lease can account for gets None."""
    targets = {d.name: d.target for d in history.destinations}
    ids = message_ids(history)
    rows = attempt_rows(history)
    by_message: dict[int, list[Request]] = defaultdict(list)
    ties: list[Tie] = []
    for r in history.requests:
        target = targets.get(r.destination)
        mid = None if target is None or r.key is None else ids.get((target, r.key))
        if mid is None:
            ties.append(Tie(r, None, None))
        else:
            by_message[mid].append(r)
    for mid, requests in by_message.items():
        candidates = [lease for lease in leases.get(mid, []) if lease.sent]
        ordered = sorted(requests, key=lambda r: r.arrival)
        chosen = _matching(ordered, candidates, rows)
        ties.extend(Tie(r, mid, chosen.get(i)) for i, r in enumerate(ordered))
    return ties


def _matching(
    requests: Sequence[Request], leases: Sequence[Lease], rows: dict[tuple[int, int], AttemptRow]
) -> dict[int, Lease]:
    """A largest matching of requests to leases (Kuhn's augmenting paths; each
    message has a handful of each). The lease whose span holds the request is
    tried first, so an ordinary history is tied as it happened."""
    edges: list[list[int]] = []
    for r in requests:
        fits = []
        for j, lease in enumerate(leases):
            if lease.claimed_at > r.arrival:
                continue
            inside = r.arrival <= lease.finish
            if inside or not answered(lease, rows):
                fits.append((0 if inside else 1, j))
        edges.append([j for _, j in sorted(fits)])
    owner: dict[int, int] = {}

    def augment(i: int, seen: set[int]) -> bool:
        for j in edges[i]:
            if j in seen:
                continue
            seen.add(j)
            if j not in owner or augment(owner[j], seen):
                owner[j] = i
                return True
        return False

    for i in range(len(requests)):
        augment(i, set())
    return {i: leases[j] for j, i in owner.items()}
