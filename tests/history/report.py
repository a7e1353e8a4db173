"""Each seed's outcome in a few numbers, and the table of invariants by faults."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tests.history.checks import CHECKS, Facts, facts
from tests.history.checks.policies import in_flight, versions
from tests.history.fence import FENCED
from tests.history.history import History
from tests.history.violation import Violation
from tests.history.workload import ARRANGED_KINDS, FAULT_KINDS


@dataclass(frozen=True)
class Outcome:
    seed: int
    messages: int = 0  # committed messages
    requests: int = 0
    redelivered: int = 0  # requests beyond the first of each message
    dead: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    exercised: Counter[str] = field(default_factory=Counter)  # see exercised()
    violations: tuple[Violation, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    error: str | None = None  # the run itself failed (not a violation)

    @property
    def unexpected(self) -> list[Violation]:
        return [v for v in self.violations if v.known is None]

    def line(self) -> str:
        faults = " ".join(f"{k}={n}" for k, n in sorted(self.faults.items()))
        verdict = (
            f"ERROR {self.error}"
            if self.error
            else f"{len(self.unexpected)} violations"
            + (
                f" (+{len(self.violations) - len(self.unexpected)} known)"
                if self.violations
                else ""
            )
        )
        return (
            f"seed {self.seed}: {self.messages} messages ({self.dead} dead), {self.requests} "
            f"requests ({self.redelivered} redelivered), faults {faults or '-'}, "
            f"{self.seconds:.0f} s: {verdict}\n  exercised: "
            + " ".join(f"{k}={self.exercised[k]}" for k in ASSERTED)
            + " | "
            + " ".join(f"{k}={n}" for k, n in sorted(self.exercised.items()) if k not in ASSERTED)
        )


ASSERTED = (
    "lost_leases",
    "fenced_outcomes",
    "contended_keys",
    "at_cap",
    "replayed",
    "dead_retried",
)
"""What a short run must have exercised (``tests/history/test_history.py``), each
at least once; its plan arranges every one (:data:`tests.history.workload.ARRANGED_KINDS`)."""


def exercised(f: Facts) -> Counter[str]:
    """How much of what the checks look for the run produced, read from the
    history (what the database, the receivers and the dispatchers' logs saw, not
    what the plan meant to do): rolled-back and ambiguous commits, shared keys,
    ordered messages, inbox duplicates, requests sent after their lease ended,
    breakers opened and probed, holds, and the :data:`ASSERTED`:

    - ``lost_leases``: leases that ran out and were rescued (or taken) by another;
    - ``fenced_outcomes``: outcome writes the lease fence stopped (the writer's
      ``lease_lost`` "outcome fenced out", its lease rescued in the audit), of
      ``given_up``: every lease a dispatcher logged as lost;
    - ``contended_keys``: advisory locks (ordering keys) that two producer
      sessions were seen waiting for at once (:mod:`tests.history.locks`);
    - ``at_cap``: arrivals at a capped destination that made the requests in
      flight there as many as the cap in force;
    - ``replayed``, ``dead_retried``: messages an operator moved back (a second
      insert of a delivered id; dead to ready) that were claimed again.
    """
    h = f.history
    out: Counter[str] = Counter()
    out["rolled_back"] = sum(1 for t in h.txns if t.committed is False)
    out["ambiguous_commits"] = sum(1 for t in h.txns if t.commit_sent and not t.commit_returned)
    returned = Counter(i for t in h.txns for w in t.writes for i in w.ids)
    out["shared_keys"] = sum(1 for n in returned.values() if n > 1)
    out["ordered"] = len(f.ordering_keys())
    out["inbox_duplicates"] = sum(1 for r in h.requests if r.effect == "duplicate")
    out["lost_leases"] = sum(
        1 for ls in f.leases.values() for x in ls if x.end in ("rescued", "taken")
    )
    out["given_up"] = sum(len(p.lost) for p in h.processes)
    out["fenced_outcomes"] = sum(
        1
        for p in h.processes
        for mid, attempt, reason in p.lost
        if reason == FENCED
        and any(
            x.attempt == attempt and x.owner == p.owner and x.end in ("rescued", "taken")
            for x in f.leases.get(mid, [])
        )
    )
    out["contended_keys"] = len(
        {w.lock for w in h.lock_waits if sum(a.startswith("producer-") for a in w.waiting) >= 2}
    )
    out["late_sends"] = sum(1 for t in f.ties if t.late)
    out["breaker_opened"] = sum(1 for e in h.health_events if e.new_state == "open")
    out["probes"] = sum(1 for e in h.health_events if e.new_state == "probing")
    out["holds"] = sum(1 for e in h.health_events if e.new_state == "held")
    for d in h.destinations:
        listed = versions(f, d.name)
        if all(v.cap is None for v in listed):
            continue
        flights = in_flight(f, d.name)
        for x in flights:
            caps = [v.cap for v in listed if v.lo <= x.start <= v.hi]
            if not caps or None in caps:
                continue
            together = sum(1 for y in flights if y.start <= x.start < y.stop)
            out["at_cap"] += together >= max(c for c in caps if c is not None)
    for r in f.reopens:
        if any(x.claim_seq > r.event.seq for x in f.leases.get(r.message_id, [])):
            out["replayed" if r.kind == "replay" else "dead_retried"] += 1
    return +out


def outcome(
    history: History, violations: list[Violation], seconds: float, f: Facts | None = None
) -> Outcome:
    committed = {m.id for m in history.finals}
    arrived = Counter(r.key for r in history.requests if r.key is not None)
    return Outcome(
        seed=history.seed,
        messages=len(committed),
        requests=len(history.requests),
        redelivered=sum(n - 1 for n in arrived.values()),
        dead=sum(1 for m in history.finals if m.state == "dead"),
        faults=Counter(x.kind for x in (*history.faults, *history.operations)),
        exercised=exercised(f or facts(history)),
        violations=tuple(violations),
        notes=history.notes,
        seconds=seconds,
    )


def table(outcomes: list[Outcome]) -> str:
    """Rows: invariants; columns: all seeds, then the seeds that injected each
    fault. A cell is ``v/n``: of the n seeds, v broke the invariant (``+k``: k
    more broke it only by a known defect)."""
    done = [o for o in outcomes if o.error is None]
    kinds = [k for k in (*FAULT_KINDS, *ARRANGED_KINDS) if any(o.faults[k] for o in done)]
    lines = [
        f"seeds {len(outcomes)} ({len(outcomes) - len(done)} failed to run), messages "
        f"{sum(o.messages for o in done):,}, requests {sum(o.requests for o in done):,} "
        f"(redelivered {sum(o.redelivered for o in done):,}), dead "
        f"{sum(o.dead for o in done):,}, {sum(o.seconds for o in outcomes) / 60:.1f} min",
        "faults injected: " + ", ".join(f"{k} {sum(o.faults[k] for o in done)}" for k in kinds),
        "exercised: "
        + ", ".join(
            f"{k} {n}" for k, n in sorted(sum((o.exercised for o in done), Counter()).items())
        ),
        "",
    ]
    columns = ["all", *kinds]
    width = max(len(name) for name in CHECKS) + 2
    lines.append("invariant".ljust(width) + "".join(c.rjust(13) for c in columns))
    for name in CHECKS:
        cells = []
        for column in columns:
            group = [o for o in done if column == "all" or o.faults[column]]
            bad = sum(1 for o in group if any(v.check == name for v in o.unexpected))
            known = sum(
                1
                for o in group
                if any(v.check == name for v in o.violations)
                and not any(v.check == name for v in o.unexpected)
            )
            cells.append(f"{bad}/{len(group)}" + (f"+{known}k" if known else ""))
        lines.append(name.ljust(width) + "".join(c.rjust(13) for c in cells))
    failing = {
        name: sorted({o.seed for o in done for v in o.violations if v.check == name})
        for name in CHECKS
    }
    listed = [f"  {name}: seeds {seeds}" for name, seeds in failing.items() if seeds]
    if listed:
        lines += ["", "seeds with violations (known defects included):", *listed]
    errors = [f"  seed {o.seed}: {o.error}" for o in outcomes if o.error]
    if errors:
        lines += ["", "runs that failed:", *errors]
    return "\n".join(lines)
