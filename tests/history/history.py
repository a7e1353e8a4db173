"""The recorded history of one run, as plain immutable values.

Times are seconds since the epoch (``time.time()``), on every side: producers and
receivers stamp with this host's clock, and the audit triggers convert the
server's (:mod:`tests.history.audit`), which runs on this host too. A history is
all the checks read; each can be written by hand for a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

INF = float("inf")


@dataclass(frozen=True)
class Write:
    """One call a producer made inside a transaction."""

    kind: str  # "enqueue" | "publish"
    destination: str  # the destination's name (enqueue) or the event type (publish)
    key: str  # idempotency key (enqueue) or event key (publish)
    ordering_key: str | None
    ids: tuple[int, ...]  # what the call returned


@dataclass(frozen=True)
class Txn:
    """One producer transaction and what became of it.

    ``committed`` is the resolved outcome: True when the commit returned, False
    when it was rolled back (on purpose or by an error), and for a commit whose
    answer was lost, what ``pg_xact_status`` of its xid said afterwards (None if
    even that is unknown)."""

    producer: int
    number: int
    xid: int | None
    intended: str  # "commit" | "rollback"
    committed: bool | None
    began: float
    commit_sent: float | None  # just before COMMIT was sent
    commit_returned: float | None  # just after it returned
    writes: tuple[Write, ...]
    error: str | None = None

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(i for w in self.writes for i in w.ids)


@dataclass(frozen=True)
class Request:
    """One request a receiver saw.

    ``arrival`` is stamped once the whole request was read; ``end`` just before
    the first byte of the answer was written, or when the client closed the
    connection, or when the receiver gave up on it (a hang), whichever came
    first. So [arrival, end] lies within the time the sender had it in flight."""

    destination: str
    key: str | None  # Idempotency-Key, unwrapped (for webhooks also the webhook-id)
    arrival: float
    end: float
    end_kind: str  # answered | client_closed | receiver_closed | reset | shutdown
    status: int | None  # the status answered, None if none was
    behavior: str  # what the receiver chose to do (ok, slow, fail, late, hang, ...)
    effect: str | None = None  # the inbox: applied | duplicate | rejected | ambiguous
    signature: bool | None = None  # a webhook's signature verified (None: not a webhook)
    connection: int = 0


@dataclass(frozen=True)
class MessageEvent:
    """A change of a ``messages`` row (see :mod:`tests.history.audit`)."""

    seq: int
    at: float
    txn_start: float
    xid: int
    app: str
    op: str  # insert | update | delete
    id: int
    destination: str | None = None
    ordering_key: str | None = None
    old_state: str | None = None
    new_state: str | None = None
    old_attempts: int | None = None
    new_attempts: int | None = None
    old_owner: str | None = None
    new_owner: str | None = None
    old_lease_until: float | None = None
    new_lease_until: float | None = None
    last_error: str | None = None
    last_status: int | None = None
    idempotency_key: str | None = None
    target: str | None = None


@dataclass(frozen=True)
class HealthEvent:
    """A change of a ``destination_health`` row."""

    seq: int
    at: float
    txn_start: float
    xid: int
    app: str
    op: str
    destination: str
    old_state: str | None = None
    new_state: str | None = None  # None: the row was deleted (the breaker closed)
    old_blocked_until: float | None = None
    new_blocked_until: float | None = None
    probe_owner: str | None = None
    failed_probes: int | None = None


@dataclass(frozen=True)
class SlotEvent:
    """A change of a ``destination_slots`` row (evidence for cap violations)."""

    seq: int
    at: float
    xid: int
    app: str
    op: str
    destination: str
    slot: int
    old_holder: int | None
    new_holder: int | None


@dataclass(frozen=True)
class AttemptRow:
    """A row of ``attempts``."""

    message_id: int
    attempt: int
    owner: str
    started_at: float
    duration_ms: int | None
    status: int | None
    outcome: str
    error_class: str | None = None


@dataclass(frozen=True)
class FinalMessage:
    """A message at the end: its ``messages`` row, or its ``delivered`` row."""

    id: int
    idempotency_key: str
    target: str
    destination: str
    ordering_key: str | None
    state: str  # delivered | dead | ready | running | paused
    attempts: int
    max_attempts: int
    last_error: str | None = None
    last_status: int | None = None


@dataclass(frozen=True)
class Destination:
    """A destination of the run: a receiver, and what the outbox calls it."""

    name: str
    kind: str  # "plain" | "endpoint"
    destination: str  # messages.destination: the URL's origin, or "endpoint:<id>"
    target: str  # messages.target: the URL enqueued, or "endpoint:<id>"
    inbox: bool = False  # applies effects through outbox.receiver.Inbox
    secret: str | None = None  # an endpoint's signing secret


@dataclass(frozen=True)
class PolicyChange:
    """A cap or rate limit set on a destination: ``before`` just before the
    transaction that set it began, ``after`` once its commit returned (so the
    change took effect for statements somewhere in between). The first policy of
    a destination is set before any dispatcher starts."""

    destination: str  # the destination's name
    cap: int | None
    rate: float | None
    burst: int | None
    before: float
    after: float


@dataclass(frozen=True)
class Fault:
    """A fault injected: what, on whom, from when until when."""

    kind: str  # a FAULT_KINDS or ARRANGED_KINDS entry (tests.history.workload)
    target: str
    at: float
    until: float
    detail: str = ""


@dataclass(frozen=True)
class Operation:
    """An operator's command (``outbox.admin``) in a transaction of its own, by the
    session ``history-operator``: a ``replay`` of delivered webhook messages
    (``replay_message``) or a ``dead_retry`` of dead ones. ``before`` just before
    the transaction began, ``after`` once its commit returned; ``moved``: how many
    messages the command said it moved back (None: it raised ``error``)."""

    kind: str  # replay | dead_retry
    ids: tuple[int, ...]  # the messages it named
    xid: int | None
    before: float
    after: float
    moved: int | None
    error: str | None = None


@dataclass(frozen=True)
class LockWait:
    """A sample of ``pg_locks``: at ``at``, the sessions (application names) waiting
    together for one advisory lock (``classid:objid``) not yet granted to them."""

    at: float
    lock: str
    waiting: tuple[str, ...]


@dataclass(frozen=True)
class Process:
    """A dispatcher process of the run: its sessions' application_name, its lease
    owner id (from its ``started`` event), and how it ended."""

    name: str
    pid: int
    owner: str | None
    started: float
    ended: float | None
    exit_code: int | None
    how: str  # "killed" | "terminated" | "running"
    events: dict[str, int] = field(default_factory=dict)  # counts of its log events
    lost: tuple[tuple[int, int, str], ...] = ()  # its lease_lost events: (id, attempt, reason)


@dataclass(frozen=True)
class Timing:
    """The dispatchers' settings the checks reason with."""

    lease: float
    request_timeout: float
    claim_timeout: float


@dataclass(frozen=True)
class History:
    seed: int
    timing: Timing
    destinations: tuple[Destination, ...] = ()
    txns: tuple[Txn, ...] = ()
    requests: tuple[Request, ...] = ()
    message_events: tuple[MessageEvent, ...] = ()
    health_events: tuple[HealthEvent, ...] = ()
    slot_events: tuple[SlotEvent, ...] = ()
    attempts: tuple[AttemptRow, ...] = ()
    finals: tuple[FinalMessage, ...] = ()
    effects: dict[str, int] = field(default_factory=dict)  # inbox key -> effects applied
    processes: tuple[Process, ...] = ()
    faults: tuple[Fault, ...] = ()
    policies: tuple[PolicyChange, ...] = ()
    operations: tuple[Operation, ...] = ()
    lock_waits: tuple[LockWait, ...] = ()
    notes: tuple[str, ...] = ()  # what the run itself observed going wrong

    def destination_named(self, name: str) -> Destination:
        for d in self.destinations:
            if d.name == name:
                return d
        raise KeyError(name)

    def by_destination(self) -> dict[str, Destination]:
        """The destinations keyed by ``messages.destination``."""
        return {d.destination: d for d in self.destinations}
