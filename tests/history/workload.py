"""The workload of one seed: destinations, producers' transactions, the dispatchers'
settings and the timeline of faults and policy changes. Pure: the same seed and
mode give the same plan (what the real system then does with it varies with
timing, which is what the checks are for).

Destinations (each its own receiver port, so its own origin):

- ``inbox``: plain, a deduping receiver that applies effects (the exactly-once
  check), answering late, failing after the effect, resetting;
- ``capped``: plain, a concurrency cap changed during the run, answers slow
  enough that the cap fills;
- ``limited``: plain, a rate limit changed during the run;
- ``flaky``: plain, switched down for a while, so that its breaker opens, probes,
  and closes;
- ``hook-a``, ``hook-b``, ``hook-c``: webhook endpoints that ``publish`` fans
  events out to (``hook-a`` capped, ``hook-b`` rate limited, ``hook-c`` an inbox).

Besides its faults, a plan arranges early on what a run should exercise and
chance may not bring (:data:`ARRANGED_KINDS`, drawn apart from the rest so that
each seed's other draws stay as they were): a stale outcome fenced out
(:mod:`tests.history.fence`), an ordering key two producers wait for at once,
messages that go dead (``lapsed-`` keys) and an operator's retry of dead
messages, and an operator's replay of delivered webhooks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

FAULT_KINDS = ("kill", "freeze", "term", "db_restart", "cap_change", "rate_change", "breaker")
"""The faults a seed may inject (the receivers' misbehaviour is always on)."""
EVENT_TYPES = ("order.paid", "order.shipped", "invoice.sent")
ARRANGED_KINDS = ("fence", "contend", "dead_retry", "replay")
"""What a plan arranges on purpose (see the module's docstring): every one in a
short plan, each with probability 3/4 otherwise."""
ORDERING_KEYS = ("acct-0", "acct-1", "acct-2", "acct-3")
PLAIN = ("inbox", "capped", "limited", "flaky")


@dataclass(frozen=True)
class Settings:
    """The dispatchers' options, kept within the lease budget (``dispatchers.runtime.config``):
    lease >= 1.5 x (request timeout + 0.05 s flush + statement timeout), and the
    claim, statement and lock timeouts at most a third of the lease."""

    lease: float = 3.0
    request_timeout: float = 0.8
    statement_timeout: float = 0.9
    dispatchers: int = 3
    concurrency: int = 8
    http_client: str = "aiohttp"
    listen: bool = True
    key_format: str = "structured"

    def args(self) -> list[str]:
        third = f"{self.statement_timeout:g}"
        return [
            *("--http-client", self.http_client, "--idempotency-key-format", self.key_format),
            *(() if self.listen else ("--no-listen",)),
            *("--lease", f"{self.lease:g}"),
            *("--request-timeout", f"{self.request_timeout:g}"),
            *("--connect-timeout", f"{min(0.5, self.request_timeout):g}"),
            *("--statement-timeout", third, "--claim-timeout", third),
            *("--lock-timeout", f"{min(0.5, self.statement_timeout):g}"),
            *("--retry-base", "0.1", "--retry-cap", "0.5", "--grace", "1"),
            *("--concurrency", str(self.concurrency), "--poll-interval", "0.5"),
            *("--breaker-window", "5", "--breaker-min-attempts", "4"),
            *("--breaker-failure-ratio", "0.5"),
            *("--breaker-backoff", "0.3", "--breaker-backoff-max", "1"),
            *("--log-level", "debug"),
        ]


@dataclass(frozen=True)
class Op:
    kind: str  # enqueue | publish
    destination: str  # a plain destination's name, or the event type
    key: str
    ordering_key: str | None = None
    max_attempts: int | None = None


@dataclass(frozen=True)
class TxnPlan:
    ops: tuple[Op, ...]
    commit: bool
    hold: float  # seconds between the last write and the commit or rollback
    pause: float  # seconds before the transaction begins


@dataclass(frozen=True)
class Receiver:
    """A destination's receiver and its policy before the dispatchers start."""

    name: str
    kind: str  # plain | endpoint
    inbox: bool = False
    fault_rate: float = 0.15
    weights: dict[str, float] = field(default_factory=dict)
    slow_share: float = 0.1
    slow: tuple[float, float] = (0.05, 0.3)
    event_types: tuple[str, ...] = ()
    cap: int | None = None
    rate: float | None = None
    burst: int | None = None


@dataclass(frozen=True)
class Step:
    """One thing the harness does, no earlier than ``at`` seconds into the traffic."""

    at: float
    kind: str  # a FAULT_KINDS or ARRANGED_KINDS entry, "breaker_up" or "lapse"
    destination: str = ""  # or, for "contend", the ordering key
    cap: int | None = None
    rate: float | None = None
    burst: int | None = None
    victim: int = 0  # which running dispatcher (or message), as an index into them


@dataclass(frozen=True)
class Plan:
    seed: int
    settings: Settings
    receivers: tuple[Receiver, ...]
    producers: tuple[tuple[TxnPlan, ...], ...]
    steps: tuple[Step, ...]
    traffic: float  # seconds the producers are planned to span
    faults: frozenset[str]  # and the ARRANGED_KINDS the plan arranges

    def receiver(self, name: str) -> Receiver:
        return next(r for r in self.receivers if r.name == name)


def plan(seed: int, *, short: bool = False) -> Plan:
    """The plan of ``seed``. ``short``: every fault and every arranged kind, one
    fewer producer and a shorter traffic, for CI; otherwise each fault kind and
    each arranged kind is in with probability 3/4 and the sizes vary."""
    rng = random.Random(seed)
    if short:
        settings = Settings()
        faults = frozenset(FAULT_KINDS)
        traffic, producers, txns = 14.0, 3, 22
    else:
        variant = random.Random(f"{seed}:variant")
        lease = rng.choice((2.0, 3.0))
        timeout = 0.6 if lease == 2.0 else 0.8
        settings = Settings(
            lease=lease,
            request_timeout=timeout,
            statement_timeout=0.6 if lease == 2.0 else 0.9,
            dispatchers=rng.choice((2, 3, 3)),
            concurrency=rng.choice((4, 8, 16)),
            # drawn apart, so that adding these kept every seed's plan as it was
            http_client=variant.choice(("aiohttp", "aiohttp", "httpx")),
            listen=variant.random() < 0.8,
            key_format=variant.choice(("structured", "raw")),
        )
        faults = frozenset(k for k in FAULT_KINDS if rng.random() < 0.75)
        traffic, producers, txns = rng.uniform(14, 24), rng.choice((2, 3, 4)), rng.randint(18, 36)
    receivers = _receivers(rng)
    keys = _Keys(rng)
    plans = tuple(
        tuple(_txn(rng, keys, traffic / txns) for _ in range(txns)) for _ in range(producers)
    )
    steps = _steps(rng, faults, traffic, receivers)
    apart = random.Random(f"{seed}:arranged")
    arranged = frozenset(k for k in ARRANGED_KINDS if short or apart.random() < 0.75)
    steps = tuple(sorted(steps + _arranged(apart, arranged, traffic), key=lambda s: s.at))
    return Plan(seed, settings, receivers, plans, steps, traffic, faults | arranged)


def _receivers(rng: random.Random) -> tuple[Receiver, ...]:
    weights = {"fail": 2, "fail_after": 2, "late": 1, "hang": 1, "reset": 1, "throttle": 0.5}
    return (
        Receiver("inbox", "plain", inbox=True, weights=weights),
        Receiver(
            "capped",
            "plain",
            fault_rate=0.1,
            weights={"fail": 1, "hang": 1},
            slow_share=0.8,
            slow=(0.1, 0.4),
            cap=rng.choice((2, 3)),
        ),
        Receiver(
            "limited",
            "plain",
            fault_rate=0.1,
            weights={"fail": 1},
            rate=rng.choice((4.0, 6.0, 8.0)),
            burst=rng.choice((1, 2, 3)),
        ),
        Receiver("flaky", "plain", fault_rate=0.1, weights={"fail": 1, "late": 1}),
        Receiver(
            "hook-a",
            "endpoint",
            weights={"fail": 1, "reset": 1},
            slow_share=0.5,
            event_types=("order.*",),
            cap=2,
        ),
        Receiver(
            "hook-b",
            "endpoint",
            weights={"fail": 1},
            event_types=("order.paid", "invoice.*"),
            rate=5.0,
            burst=2,
        ),
        Receiver("hook-c", "endpoint", inbox=True, weights=weights),
    )


class _Keys:
    """Idempotency keys and event keys, some reused (by this producer or another):
    the same key for the same destination is the same request, so a reuse either
    returns the committed message's id or, while the first writer is still open,
    waits for it."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: dict[str, list[str]] = {}
        self.count = 0

    def key(self, space: str, prefix: str = "") -> str:
        used = self.used.setdefault(space, [])
        if used and not prefix and self.rng.random() < 0.15:
            return self.rng.choice(used[-8:])
        self.count += 1
        key = f"{prefix}{space}-{self.count}"
        if not prefix:  # a prefixed key (poison, doomed, a burst's) is never reused
            used.append(key)
        return key


def _txn(rng: random.Random, keys: _Keys, spacing: float) -> TxnPlan:
    ops = []
    if rng.random() < 0.2:
        # a burst to a policed destination, so that its cap fills or its rate limit
        # holds claims back (no ordering key: those would go one at a time)
        if rng.random() < 0.7:
            destination = rng.choice(("capped", "capped", "limited"))
            for _ in range(rng.randint(4, 10)):
                ops.append(Op("enqueue", destination, keys.key(destination), None, 25))
        else:
            for _ in range(rng.randint(3, 6)):
                ops.append(Op("publish", "order.paid", keys.key("evt", "burst-"), None))
    for _ in range(rng.choice((0, 1, 1, 2, 3)) if ops else rng.choice((1, 1, 2, 3))):
        ordering = rng.choice(ORDERING_KEYS) if rng.random() < 0.35 else None
        if rng.random() < 0.25:
            key = keys.key("evt")
            # an event key is one event: its type follows from it, as its payload does
            event_type = EVENT_TYPES[sum(map(ord, key)) % len(EVENT_TYPES)]
            ops.append(Op("publish", event_type, key, ordering))
            continue
        destination = rng.choice(PLAIN)
        roll = rng.random()
        if roll < 0.04:
            ops.append(Op("enqueue", destination, keys.key(destination, "poison-"), ordering))
        elif roll < 0.08 and destination != "flaky":
            ops.append(Op("enqueue", destination, keys.key(destination, "doomed-"), ordering, 2))
        else:
            ops.append(Op("enqueue", destination, keys.key(destination), ordering, 25))
    return TxnPlan(
        tuple(ops),
        commit=rng.random() >= 0.15,
        hold=rng.uniform(0, 0.08),
        pause=rng.uniform(0.3, 1.7) * spacing,
    )


def _steps(
    rng: random.Random, faults: frozenset[str], traffic: float, receivers: tuple[Receiver, ...]
) -> tuple[Step, ...]:
    """The faults' steps, in no order."""

    def at(fraction: float) -> float:
        return traffic * (fraction + rng.uniform(-0.04, 0.04))

    steps: list[Step] = []
    capped, hook_a = next(r for r in receivers if r.name == "capped"), receivers[4]
    if "cap_change" in faults:
        cap = capped.cap or 2
        steps += [
            Step(at(0.12), "cap_change", "capped", cap=1),
            Step(at(0.45), "cap_change", "hook-a", cap=rng.choice((1, 3))),
            Step(at(0.55), "cap_change", "capped", cap=cap + 1),
            Step(at(0.8), "cap_change", "capped", cap=cap - 1),
        ]
        if hook_a.cap:
            steps.append(Step(at(0.85), "cap_change", "hook-a", cap=hook_a.cap))
    if "rate_change" in faults:
        steps += [
            Step(
                at(0.4),
                "rate_change",
                "limited",
                rate=rng.choice((3.0, 10.0)),
                burst=rng.choice((1, 4)),
            ),
            Step(at(0.7), "rate_change", "hook-b", rate=rng.choice((2.0, 8.0)), burst=1),
        ]
    if "kill" in faults:
        steps.append(Step(at(0.2), "kill", victim=rng.randrange(8)))
    if "breaker" in faults:
        steps += [Step(at(0.25), "breaker", "flaky"), Step(at(0.6), "breaker_up", "flaky")]
    if "freeze" in faults:
        steps.append(Step(at(0.3), "freeze", victim=rng.randrange(8)))
    if "term" in faults:
        steps.append(Step(at(0.62), "term", victim=rng.randrange(8)))
    if "db_restart" in faults:
        steps.append(Step(at(0.75), "db_restart"))
    return tuple(steps)


def _arranged(rng: random.Random, kinds: frozenset[str], traffic: float) -> tuple[Step, ...]:
    """The steps of the arranged kinds, early in the traffic: a fence first (it
    takes a lease and a rescue), messages that go dead soon after, the contention
    while the producers run, then the dead retry and the replay (each waits,
    bounded, for a message to act on)."""

    def at(fraction: float) -> float:
        return traffic * (fraction + rng.uniform(-0.02, 0.02))

    steps = []
    if "fence" in kinds:
        steps.append(Step(at(0.06), "fence", "inbox"))
    if "dead_retry" in kinds:
        steps += [
            Step(at(0.03), "lapse", "inbox"),
            Step(at(0.3), "dead_retry", victim=rng.randrange(64)),
        ]
    if "contend" in kinds:
        steps.append(Step(at(0.15), "contend", rng.choice(ORDERING_KEYS)))
    if "replay" in kinds:
        steps.append(Step(at(0.35), "replay", victim=rng.randrange(64)))
    return tuple(steps)
