"""``outbox bench``: throughput and latency of the outbox on this machine.

Scenarios (see :mod:`dispatchers.bench.scenarios`): ``drain-http``,
``drain-noop``, ``latency``, ``enqueue``, ``commit-latency``, ``history`` and
``memory`` by default, and ``soak`` (minutes long) only when named.
``--baseline naive`` runs the naive one-row-at-a-time design
(:mod:`dispatchers.bench.baselines.naive`) beside the drain scenarios, interleaved;
``--baseline pgqueuer`` runs pgqueuer (:mod:`dispatchers.bench.baselines.pgqueuer`,
the ``bench`` extra) beside the drain scenarios, interleaved, and beside ours in the
latency scenario. The runner (:mod:`dispatchers.bench.runner`) prints one table, or
one JSON object with ``--json``.

The bench runs SQL of its own (outside :mod:`dispatchers.store`): it makes and
drops its scratch schemas, seeds backlogs, plays the producers, and runs the
baselines, whose statements are the designs being measured.

This module holds only the settings (the command-line options are in
:mod:`dispatchers.cli.bench`), so building the ``outbox`` parser imports nothing
heavy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BASELINE_NAMES",
    "DEFAULT_SCENARIOS",
    "LATENCY_SECONDS",
    "SCENARIO_NAMES",
    "SOAK_SECONDS",
    "Settings",
]

DEFAULT_SCENARIOS = (
    "drain-http",
    "drain-noop",
    "latency",
    "enqueue",
    "commit-latency",
    "history",
    "memory",
)
SCENARIO_NAMES = (*DEFAULT_SCENARIOS, "soak")
LATENCY_SECONDS = 10.0
"""How long each latency run offers its load unless ``--duration`` says."""
SOAK_SECONDS = 300.0
"""How long the soak offers its load unless ``--duration`` says."""
BASELINE_NAMES = ("naive", "pgqueuer")


@dataclass(frozen=True)
class Settings:
    """Sizes and knobs of every scenario (the default scenarios take about 7
    minutes on 2 cores; a baseline adds its drains, and pgqueuer its latency runs)."""

    messages: int = 20_000
    concurrency: int = 64
    batch_size: int = 100
    destinations: int = 1
    """Origins the drain-http backlog is spread over, in turn: the shared receiver
    listens on a port for each."""
    repeat: int = 1
    rates: tuple[float, ...] = (50.0, 500.0, 2000.0)
    dispatchers: tuple[int, ...] = (1, 3)
    duration: float | None = None
    """Seconds the load is offered in each latency run and in the soak; None: each
    one's own (:data:`LATENCY_SECONDS`, :data:`SOAK_SECONDS`)."""
    claim_window: float = 0.005
    """The dispatchers' ``--claim-window`` in the latency scenario."""
    enqueue_count: int = 5_000
    enqueue_batch: int = 100
    commit_workers: tuple[int, ...] = (4, 8)
    commit_seconds: float = 3.0
    commit_rounds: int = 2
    commit_rates: tuple[float, ...] = (500.0, 1000.0, 2000.0)
    commit_producers: int = 8
    commit_rate_seconds: float = 3.0
    commit_dispatcher: str = "both"
    """commit-latency with a dispatcher consuming: "off", "on" or "both"."""
    history_rows: int = 1_000_000
    history_messages: int = 20_000
    history_rounds: int = 2
    memory_messages: int = 5_000
    memory_delay: float = 0.5
    big_response_share: float = 0.01
    big_response_mb: float = 50.0
    baselines: tuple[str, ...] = ()
    pairs: int = 3
    naive_workers: int = 32
    drain_timeout: float = 300.0
    http_client: str | None = None
    """None: the dispatcher's default (``DispatcherConfig.http_client``)."""
    trace: bool = False
    """Our dispatcher's drains record a span per attempt (see
    :func:`dispatchers.bench.measure.recording_tracer_provider`)."""
    event_loop: str = "auto"
    """The loop every drain and the latency scenario run on (see
    :mod:`dispatchers.runtime.loop`); the report names the one used."""
    soak_rate: float = 200.0
    soak_dispatchers: int = 2
    soak_interval: float = 60.0
    """Seconds per reported interval of the soak, and between two restarts."""
    soak_fail_share: float = 0.05
    soak_slow_share: float = 0.05
    soak_slow_delay: float = 0.2

    def offered_seconds(self, default: float) -> float:
        """``duration``, or the scenario's own ``default`` when none was given."""
        return default if self.duration is None else self.duration
