"""The delivery contract, end to end: nothing committed lost, nothing rolled back
sent, ordering keys in commit order, redelivery only where the protocol allows
it, one effect per key at the deduping receiver, a message an operator replayed
or retried sent again under its own key.

Each function is named after the rule of :mod:`tests.model.invariants` it
matches, where one does.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from tests.history.checks.facts import Facts, show_lease, show_tie, when
from tests.history.leases import Lease
from tests.history.violation import Violation

SETTLED = ("delivered", "dead")


def settled(f: Facts) -> list[Violation]:
    """Nothing committed is lost: every message a committed transaction wrote is
    delivered, or dead with a reason (its last error), and dead only once its
    attempts were spent or an answer said never (model: ``settled``)."""
    h = f.history
    out: list[Violation] = []
    finals = {m.id: m for m in h.finals}
    committed: dict[int, str] = {mid: f"inserted by xid {e.xid}" for mid, e in f.inserts.items()}
    for txn in h.txns:
        if txn.committed:
            for mid in txn.ids:
                committed.setdefault(mid, f"returned to producer {txn.producer} #{txn.number}")
    rows = {(a.message_id, a.attempt): a for a in h.attempts}
    for mid, why in sorted(committed.items()):
        m = finals.get(mid)
        if m is None:
            out.append(Violation("settled", f"m{mid} ({why}) is in neither messages nor delivered"))
            continue
        if m.state not in SETTLED:
            leases = f.leases.get(mid, [])
            out.append(
                Violation(
                    "settled",
                    f"m{mid} to {m.destination} is still {m.state} after the run settled "
                    f"(attempts {m.attempts}/{m.max_attempts}, last error {m.last_error!r})",
                    tuple(show_lease(lease) for lease in leases[-3:]),
                )
            )
            continue
        if m.state == "dead":
            last = rows.get((mid, m.attempts))
            final = last.outcome if last is not None else None
            if not m.last_error:
                out.append(Violation("settled", f"m{mid} is dead without a reason"))
            elif m.attempts < m.max_attempts and final not in ("failed", "gone"):
                out.append(
                    Violation(
                        "settled",
                        f"m{mid} is dead after {m.attempts} of {m.max_attempts} attempts, "
                        f"its last attempt {final!r} (not a permanent answer)",
                        (f"last error {m.last_error!r}, last status {m.last_status}",),
                    )
                )
    return out


def nothing_rolled_back_sent(f: Facts) -> list[Violation]:
    """A message exists only if its transaction committed, and is sent only after
    that commit (model: ``arrival_rules``, ``claim_rules``: "did not commit")."""
    h = f.history
    out: list[Violation] = []
    for txn in h.txns:
        if txn.committed is False and txn.xid is not None:
            written = sorted(mid for mid, e in f.inserts.items() if e.xid == txn.xid)
            if written:
                out.append(
                    Violation(
                        "nothing_rolled_back_sent",
                        f"producer {txn.producer} transaction #{txn.number} (xid {txn.xid}) "
                        f"did not commit ({txn.error or txn.intended}), yet wrote {written}",
                    )
                )
    for tie in f.ties:
        r = tie.request
        if r.key is None:
            out.append(
                Violation(
                    "nothing_rolled_back_sent",
                    "a request without an Idempotency-Key",
                    (show_tie(tie),),
                )
            )
        elif tie.message_id is None:
            out.append(
                Violation(
                    "nothing_rolled_back_sent",
                    f"{r.destination} received key {r.key!r}, which no committed message has",
                    (show_tie(tie),),
                )
            )
        else:
            insert = f.inserts.get(tie.message_id)
            writer = None if insert is None else f.txn_by_xid.get(insert.xid)
            if (
                writer is not None
                and writer.commit_sent is not None
                and (r.arrival < writer.commit_sent)
            ):
                out.append(
                    Violation(
                        "nothing_rolled_back_sent",
                        f"m{tie.message_id} arrived at {when(r.arrival)}, before its "
                        f"transaction's commit was sent at {when(writer.commit_sent)}",
                        (show_tie(tie),),
                    )
                )
    return out


def _commit_order(f: Facts) -> dict[str, list[tuple[float, int]]]:
    """Per ordering key, its messages' (commit time, id) in commit order. Two
    transactions writing one key are serialised by the key's lock, so the one
    whose COMMIT was sent first committed first: the later one took the lock, and
    so sent its COMMIT, only after the earlier had committed."""
    keys = f.ordering_keys()
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for mid, key in keys.items():
        insert = f.inserts.get(mid)
        txn = None if insert is None else f.txn_by_xid.get(insert.xid)
        if txn is not None and txn.commit_sent is not None and txn.committed:
            out[key].append((txn.commit_sent, mid))
    for listed in out.values():
        listed.sort()
    return out


def commit_follows_ids(f: Facts) -> list[Violation]:
    """The ids of one ordering key follow its commit order (model:
    ``commit_follows_ids``)."""
    out = []
    for key, listed in _commit_order(f).items():
        for (t1, a), (t2, b) in itertools.pairwise(listed):
            if a > b and t1 != t2:
                out.append(
                    Violation(
                        "commit_follows_ids",
                        f"ordering key {key}: m{a} committed (sent {when(t1)}) before m{b} "
                        f"(sent {when(t2)}) but has the larger id",
                    )
                )
    return out


def first_arrivals_follow_commit_order(f: Facts) -> list[Violation]:
    """A message of an ordering key first reaches its receiver only after every
    message of the key committed before it reached its own, or went dead first
    (model: ``arrival_rules``)."""
    out = []
    first: dict[int, float] = {}
    for mid, ties in f.requests_of().items():
        first[mid] = ties[0].request.arrival
    dead_at: dict[int, float] = {}
    for mid, leases in f.leases.items():
        for lease in leases:
            if lease.end == "dead" and lease.ended_at is not None:
                dead_at.setdefault(mid, lease.ended_at)
    for key, listed in _commit_order(f).items():
        for j, (_, later) in enumerate(listed):
            if later not in first:
                continue
            t = first[later]
            for _, earlier in listed[:j]:
                if earlier == later:
                    continue
                if first.get(earlier, float("inf")) < t or dead_at.get(earlier, t) < t:
                    continue
                out.append(
                    Violation(
                        "first_arrivals_follow_commit_order",
                        f"ordering key {key}: m{later} first arrived at {when(t)}, before m"
                        f"{earlier}, committed earlier, arrived ({when(first.get(earlier))}) "
                        "or went dead",
                        tuple(show_tie(x) for x in f.requests_of().get(earlier, [])[:2])
                        + tuple(show_tie(x) for x in f.requests_of()[later][:2]),
                    )
                )
    return out


def one_message_of_a_key_in_flight(f: Facts) -> list[Violation]:
    """No two messages of one ordering key are running at once (model:
    ``state_rules``). A lease's end commits before a later claim can see it, so
    its change is recorded first: leases of a key never overlap."""
    keys = f.ordering_keys()
    by_key: dict[str, list[Lease]] = defaultdict(list)
    for mid, leases in f.leases.items():
        if mid in keys:
            by_key[keys[mid]].extend(leases)
    out = []
    for key, leases in by_key.items():
        leases.sort(key=lambda lease: lease.claimed_at)
        for i, a in enumerate(leases):
            for b in leases[i + 1 :]:
                if b.claimed_at >= a.finish:
                    break
                if b.message_id != a.message_id:
                    out.append(
                        Violation(
                            "one_message_of_a_key_in_flight",
                            f"ordering key {key}: m{b.message_id} was claimed while "
                            f"m{a.message_id} was running",
                            (show_lease(a), show_lease(b)),
                        )
                    )
    return out


def redelivered_only_after_open_attempt(f: Facts) -> list[Violation]:
    """Each attempt sends at most one request, and a request arrives while its
    lease runs, unless that lease ended with no answer recorded (a timeout, a lost
    connection, a lease that ran out, a cut at shutdown): a message reaches its
    receiver again only where a lease ended without an outcome, or an outcome
    asked for a retry (model: ``state_rules``, "reached the receiver again")."""
    out = []
    requests = f.requests_of()
    for tie in f.ties:
        if tie.message_id is None or tie.lease is not None:
            continue
        mid = tie.message_id
        out.append(
            Violation(
                "redelivered_only_after_open_attempt",
                f"a request of m{mid} at {when(tie.request.arrival)} that no attempt accounts "
                f"for ({len(requests[mid])} requests, "
                f"{sum(1 for x in f.leases.get(mid, []) if x.sent)} attempts sent)",
                tuple(show_tie(t) for t in requests[mid])
                + tuple(show_lease(lease) for lease in f.leases.get(mid, [])),
            )
        )
    return out


def effects_applied_once(f: Facts) -> list[Violation]:
    """The deduping receiver applies each key's effect once, and a delivered
    message's effect is applied (model: ``state_rules``, "the inbox applied")."""
    h = f.history
    out = []
    for key, n in sorted(h.effects.items()):
        if n > 1:
            out.append(
                Violation("effects_applied_once", f"the inbox applied key {key!r} {n} times")
            )
    inboxes = {d.target for d in h.destinations if d.inbox}
    for m in h.finals:
        if m.target in inboxes and m.state == "delivered" and h.effects.get(m.idempotency_key) != 1:
            out.append(
                Violation(
                    "effects_applied_once",
                    f"m{m.id} was delivered to the inbox but its effect was applied "
                    f"{h.effects.get(m.idempotency_key, 0)} times",
                    tuple(show_tie(t) for t in f.requests_of().get(m.id, [])),
                )
            )
    return out


def webhooks_signed(f: Facts) -> list[Violation]:
    """Every webhook request carries a valid Standard Webhooks signature."""
    return [
        Violation(
            "webhooks_signed", "a webhook request whose signature did not verify", (show_tie(t),)
        )
        for t in f.ties
        if t.request.signature is False
    ]


def reopened_sent_again(f: Facts) -> list[Violation]:
    """A message an operator moved back (a replayed webhook, a retried dead
    message) is claimed again and reaches its receiver again after the move, under
    its id and its key: the same ``Idempotency-Key`` / ``webhook-id``, which the
    receiver dedupes (docs/explanation/delivery-contract.md; a request under
    another key would match no message). A paused one (its endpoint disabled)
    waits instead. And each command moved back as many as it reported."""
    h = f.history
    out = []
    finals = {m.id: m for m in h.finals}
    requests = f.requests_of()
    for r in f.reopens:
        e = r.event
        final = finals.get(r.message_id)
        if final is not None and final.state == "paused":
            continue
        claimed = [x for x in f.leases.get(r.message_id, []) if x.claim_seq > e.seq and x.sent]
        arrived = [t for t in requests.get(r.message_id, []) if t.request.arrival > e.at]
        if not claimed or not arrived:
            out.append(
                Violation(
                    "reopened_sent_again",
                    f"m{r.message_id} moved back ({r.kind}) at {when(e.at)} was "
                    + ("never claimed again" if not claimed else "never received again"),
                    tuple(show_lease(x) for x in f.leases.get(r.message_id, [])),
                )
            )
    for op in h.operations:
        if op.error is not None or op.xid is None or op.moved is None:
            continue
        moved = sorted(r.message_id for r in f.reopens if r.event.xid == op.xid)
        if len(moved) != op.moved:
            out.append(
                Violation(
                    "reopened_sent_again",
                    f"the operator's {op.kind} of {list(op.ids)} (xid {op.xid}) reported "
                    f"{op.moved} moved back, the audit shows {moved}",
                )
            )
    return out
