"""What each scenario returns: frozen dataclasses, one definition for the table and
the ``--json`` report.

Field markers :data:`INLINE` and :data:`OPTIONAL` shape the JSON without a second
definition of it. Every result carries ``ok`` (no message lost, left behind or
delivered twice) and the ``failures`` that say why not.

The module stays whole: it is the one definition of the report; split, the
JSON's shape would be read in two places.

Design: docs/explanation/design/benchmarks.md
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Protocol

INLINE = {"inline": True}
OPTIONAL = {"optional": True}


def to_json(value: Any) -> Any:
    """``value`` as JSON-ready data: dataclasses become objects (see the markers
    above), tuples lists; anything else is returned as it is."""
    if is_dataclass(value) and not isinstance(value, type):
        data: dict[str, Any] = {}
        for f in fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("optional") and item is None:
                continue
            if f.metadata.get("inline"):
                data.update(to_json(item))
            else:
                data[f.name] = to_json(item)
        return data
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    return value


class Result(Protocol):
    """What every scenario's result has."""

    @property
    def ok(self) -> bool: ...

    @property
    def failures(self) -> list[str]: ...


@dataclass(frozen=True)
class ScenarioFailed:
    """A scenario that raised: the report says why and goes on with the next."""

    ok: bool
    failures: list[str]


# -- drains -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class DrainRun:
    """One timed drain of a backlog by our dispatcher (``design`` "outbox"), the naive
    baseline ("naive") or pgqueuer ("pgqueuer").

    The optional fields are what only some designs, or only some scenarios, report:
    the dispatcher's counters, the row counts of each design's tables, the
    receiver's view when there was a receiver, and its connections in the memory
    scenario. Fields are in the order of the JSON report.
    """

    design: str
    messages: int
    history_rows: int | None = field(default=None, metadata=OPTIONAL)
    seed_s: float
    delivered: int
    handled: int | None = field(default=None, metadata=OPTIONAL)
    retried: int | None = field(default=None, metadata=OPTIONAL)
    dead: int | None = field(default=None, metadata=OPTIONAL)
    lease_lost: int | None = field(default=None, metadata=OPTIONAL)
    db_errors: int | None = field(default=None, metadata=OPTIONAL)
    round_trips: int | None = field(default=None, metadata=OPTIONAL)
    claims: int | None = field(default=None, metadata=OPTIONAL)
    flushes: int | None = field(default=None, metadata=OPTIONAL)
    timed_out: bool
    seconds: float
    msgs_per_s: float | None
    round_trips_per_msg: float | None
    cpu_dispatcher_us_per_msg: float | None
    cpu_postgres_us_per_msg: float | None
    cpu_receiver_us_per_msg: float | None
    rows_in_messages: int | None = field(default=None, metadata=OPTIONAL)
    rows_in_delivered: int | None = field(default=None, metadata=OPTIONAL)
    rows_in_queue: int | None = field(default=None, metadata=OPTIONAL)
    rows_logged_successful: int | None = field(default=None, metadata=OPTIONAL)
    concurrency: int | None = field(default=None, metadata=OPTIONAL)
    peak_rss_mb: float | None = field(default=None, metadata=OPTIONAL)
    rss_growth_mb: float | None = field(default=None, metadata=OPTIONAL)
    receiver_requests: int | None = field(default=None, metadata=OPTIONAL)
    duplicates: int | None
    """Keys the receiver saw twice; without a receiver, None for our designs and the
    jobs handled twice for pgqueuer."""
    big_responses: int | None = field(default=None, metadata=OPTIONAL)
    ok: bool
    failures: list[str]
    receiver_connections: int | None = field(default=None, metadata=OPTIONAL)
    most_open_connections: int | None = field(default=None, metadata=OPTIONAL)
    big_mb_sent: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class DrainSummary:
    """Medians over the runs of one design; for memory, the worst run."""

    msgs_per_s: float | None
    seconds: float | None
    round_trips_per_msg: float | None
    cpu_dispatcher_us_per_msg: float | None
    cpu_postgres_us_per_msg: float | None
    cpu_receiver_us_per_msg: float | None
    peak_rss_mb: float | None
    rss_growth_mb: float | None
    delivered: int
    messages: int
    duplicates: int | None


@dataclass(frozen=True)
class NaiveFacts:
    """How the naive baseline was configured."""

    name: str
    workers: int


@dataclass(frozen=True)
class PgqueuerFacts:
    """How pgqueuer was configured."""

    name: str
    version: str | None
    managers: int
    batch_size: int


@dataclass(frozen=True)
class BaselineDrains:
    """A baseline's drains beside ours, and ours / its msgs/s for each pair."""

    facts: NaiveFacts | PgqueuerFacts = field(metadata=INLINE)
    summary: DrainSummary = field(metadata=INLINE)
    runs: list[DrainRun]
    ratios: list[float | None]
    median_ratio: float | None


@dataclass(frozen=True)
class DrainResult:
    """drain-http or drain-noop: our runs, summarised, and each baseline's."""

    concurrency: int
    batch_size: int
    destinations: int
    summary: DrainSummary = field(metadata=INLINE)
    runs: list[DrainRun]
    baselines: list[BaselineDrains]
    ok: bool
    failures: list[str]


@dataclass(frozen=True)
class HistoryResult:
    """drain-noop with a large delivered history against an empty one."""

    messages: int
    history_rows: int
    rounds: int
    empty_msgs_per_s: float | None
    full_msgs_per_s: float | None
    ratio: float | None
    ratios: list[float | None]
    history_seed_s: float
    empty_peak_rss_mb: float | None
    full_peak_rss_mb: float | None
    delivered: int
    empty_runs: list[DrainRun]
    full_runs: list[DrainRun]
    ok: bool
    failures: list[str]


@dataclass(frozen=True)
class MemoryResult:
    """drain-http at each memory concurrency against a slow, sometimes huge receiver."""

    messages: int
    big_response_share: float
    big_response_mb: float
    delay_s: float
    runs: list[DrainRun]
    ok: bool
    failures: list[str]


# -- latency ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PgqueuerLatency:
    """pgqueuer's run at one offered load: commit to receiver, CPU per message."""

    name: str
    version: str | None
    managers: int
    batch_size: int
    offered_rate: float
    duration_s: float
    messages: int
    achieved_rate: float | None
    producer_late_max_ms: float | None
    delivered: int
    received: int
    duplicates: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    cpu_dispatcher_us_per_msg: float | None
    """From the first commit until the last job was handled."""
    cpu_postgres_us_per_msg: float | None
    round_trips_per_msg: float | None
    ok: bool
    failures: list[str]


@dataclass(frozen=True)
class LatencyComparison:
    """pgqueuer's run beside one of ours, with ours / theirs (below 1: ours is lower)."""

    theirs: PgqueuerLatency = field(metadata=INLINE)
    p50_ratio: float | None
    p99_ratio: float | None
    cpu_dispatcher_us_per_msg_ratio: float | None
    cpu_postgres_us_per_msg_ratio: float | None


@dataclass(frozen=True)
class LatencyRun:
    """One offered rate with some dispatcher processes, and pgqueuer beside it."""

    offered_rate: float
    dispatchers: int
    producers: int
    duration_s: float
    messages: int
    achieved_rate: float | None
    producer_late_max_ms: float
    delivered: int
    received: int
    duplicates: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    cpu_dispatcher_us_per_msg: float | None
    cpu_postgres_us_per_msg: float | None
    round_trips_per_msg: float | None
    claims_per_msg: float | None
    empty_claim_share: float | None
    notifications_per_msg: float | None
    ok: bool
    failures: list[str]
    baseline: LatencyComparison | None = field(default=None, metadata=OPTIONAL)
    cpu_postgres_producers_us_per_msg: float | None = field(default=None, metadata=OPTIONAL)
    """Of ``cpu_postgres_us_per_msg``, what the producers' own server processes used
    (each message its own transaction: the enqueue and its commit); None when the
    server does not run on this machine."""


@dataclass(frozen=True)
class LatencyResult:
    runs: list[LatencyRun]
    ok: bool
    failures: list[str]


# -- enqueue and commit latency -----------------------------------------------------------


@dataclass(frozen=True)
class EnqueueTiming:
    """``count`` enqueues inside open transactions, with or without NOTIFY."""

    notify: bool
    count: int
    median_ms: float
    p99_ms: float | None
    commit_mean_ms: float
    enqueues_per_s: float | None
    stored: int


@dataclass(frozen=True)
class Throughput:
    """Business transactions per second at one count of connections, by mode; the
    ratios between modes; the CPU per transaction of the application (Python,
    psycopg) and of PostgreSQL, by mode."""

    workers: int
    seconds_per_mode: float
    plain_tx_per_s: float
    floor_tx_per_s: float
    outbox_tx_per_s: float
    outbox_no_notify_tx_per_s: float
    ratio: float | None
    ratio_no_notify: float | None
    floor_ratio: float | None
    outbox_to_floor: float | None
    """The target: the outbox row against the least a durable outbox writes."""
    outbox_no_notify_to_floor: float | None
    notify_cost: float | None
    client_cpu_us_per_tx: dict[str, float | None]
    postgres_cpu_us_per_tx: dict[str, float | None]


@dataclass(frozen=True)
class EnqueueResult:
    batch: int
    no_notify: EnqueueTiming
    notify: EnqueueTiming
    commit_throughput: list[Throughput]
    ok: bool
    failures: list[str]


@dataclass(frozen=True)
class PacedRate:
    """Commit latency at one offered rate, and the CPU each transaction cost (with a
    dispatcher, PostgreSQL's CPU includes what it spent dispatching)."""

    offered_tx_per_s: float
    seconds: float
    expected: int
    committed: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    p50_from_schedule_ms: float | None
    p99_from_schedule_ms: float | None
    producer_late_max_ms: float
    client_cpu_us_per_tx: float | None
    postgres_cpu_us_per_tx: float | None


@dataclass(frozen=True)
class CommitLatencyRun:
    """Every offered rate, with or without a dispatcher consuming."""

    dispatcher: bool
    rates: list[PacedRate]
    failures: list[str]


@dataclass(frozen=True)
class CommitLatencyResult:
    producers: int
    runs: list[CommitLatencyRun]
    ok: bool
    failures: list[str]


# -- soak -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trend:
    """Whether a figure stayed flat after the warm-up (its first
    ``warmup_intervals``): its peak during the warm-up and after it. ``flat`` is None
    when the run was too short to tell."""

    warmup_intervals: int
    warmup_peak: float | None
    later_peak: float | None
    flat: bool | None


@dataclass(frozen=True)
class SoakInterval:
    """One interval of the soak: what was committed, and what arrived at the
    receiver in it (each arrival counts in one interval) with its delay from commit;
    at its end, each dispatcher's RSS (None while it was down) and the claimable
    table's size, indexes included, and of its indexes."""

    number: int
    end_s: float
    committed: int
    delivered: int
    failed_requests: int
    delayed_requests: int
    lag_p50_ms: float | None
    lag_p99_ms: float | None
    rss_mb: list[float | None]
    messages_mb: float
    messages_indexes_mb: float


@dataclass(frozen=True)
class SoakResult:
    """A steady load through failures, slow answers and restarts: the intervals,
    where every committed message ended, and whether memory and the claimable table
    stayed flat (``rss`` has one trend per dispatcher never restarted)."""

    offered_rate: float
    achieved_rate: float | None
    dispatchers: int
    interval_s: float
    duration_s: float
    fail_share: float
    slow_share: float
    slow_delay_s: float
    producer_late_max_ms: float
    committed: int
    delivered: int
    retrying: int
    dead: int
    lost: int
    duplicates: int
    failed_requests: int
    delayed_requests: int
    restarts: int
    restart_stop_max_s: float | None
    intervals: list[SoakInterval]
    rss: list[Trend]
    messages_size: Trend
    ok: bool
    failures: list[str]
