"""``outbox bench``: throughput and latency of the outbox on this machine.

Scenarios (see :mod:`dispatchers.bench.scenarios`): ``drain-http``,
``drain-noop``, ``latency``, ``enqueue``, ``commit-latency``, ``history`` and
``memory``; ``--baseline naive`` runs the naive one-row-at-a-time design
(:mod:`dispatchers.bench.naive`) beside the drain scenarios, interleaved;
``--baseline pgqueuer`` runs pgqueuer (:mod:`dispatchers.bench.pgqueuer_baseline`,
the ``bench`` extra) beside the drain scenarios, interleaved, and beside ours in the
latency scenario. The runner (:mod:`dispatchers.bench.runner`) prints one table, or
one JSON object with ``--json``.

This module holds only the settings and the command-line options, so building
the ``outbox`` parser imports nothing heavy.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TypeVar

T = TypeVar("T")

__all__ = [
    "BASELINE_NAMES",
    "SCENARIO_NAMES",
    "Settings",
    "add_arguments",
    "settings_from_args",
]

SCENARIO_NAMES = (
    "drain-http",
    "drain-noop",
    "latency",
    "enqueue",
    "commit-latency",
    "history",
    "memory",
)
BASELINE_NAMES = ("naive", "pgqueuer")


@dataclass(frozen=True)
class Settings:
    """Sizes and knobs of every scenario (the defaults take about 7 minutes on
    2 cores; a baseline adds its drains, and pgqueuer its latency runs)."""

    messages: int = 20_000
    concurrency: int = 64
    batch_size: int = 100
    repeat: int = 1
    rates: tuple[float, ...] = (50.0, 500.0, 2000.0)
    dispatchers: tuple[int, ...] = (1, 3)
    duration: float = 10.0
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
    event_loop: str = "auto"
    """The loop every drain and the latency scenario run on (see
    :mod:`dispatchers.loop`); the report names the one used."""


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number, 0 or more")
    return value


def _list_of(parse: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    """An argument type: a comma-separated list of what ``parse`` accepts."""

    def parse_list(text: str) -> tuple[T, ...]:
        items = tuple(parse(part.strip()) for part in text.split(","))
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"{text!r} names a value twice")
        return items

    return parse_list


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value


_positive_ints = _list_of(_positive_int)
_positive_floats = _list_of(_positive_float)


def _listed(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``outbox bench``."""
    d = Settings()
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL to run on (each scenario makes its own schema and drops it); "
        "default: a throwaway embedded server in a temporary directory. "
        "$OUTBOX_DATABASE_URL and $DATABASE_URL are deliberately not used",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=SCENARIO_NAMES,
        metavar="NAME",
        help=f"run this scenario (repeatable; default: all of {', '.join(SCENARIO_NAMES)})",
    )
    parser.add_argument(
        "--baseline",
        dest="baselines",
        action="append",
        choices=BASELINE_NAMES,
        default=[],
        help="also run another design in the drain scenarios, interleaved with ours "
        "(A B A B ...), and print the ratios: naive (one row at a time) or pgqueuer "
        "(needs the bench extra; it also runs beside ours in latency); repeatable",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    drains = parser.add_argument_group("drain-http, drain-noop")
    drains.add_argument(
        "-n",
        "--messages",
        type=_positive_int,
        default=d.messages,
        help=f"messages per drain (default: {d.messages})",
    )
    drains.add_argument(
        "--concurrency",
        type=_positive_int,
        default=d.concurrency,
        help=f"dispatcher concurrency (default: {d.concurrency})",
    )
    drains.add_argument(
        "--batch-size",
        type=_positive_int,
        default=d.batch_size,
        help=f"dispatcher claim batch (default: {d.batch_size})",
    )
    drains.add_argument(
        "--repeat",
        type=_positive_int,
        default=d.repeat,
        help=f"drains per scenario without a baseline (default: {d.repeat})",
    )
    drains.add_argument(
        "--pairs",
        type=_positive_int,
        default=d.pairs,
        help=f"rounds of ours and each baseline's with --baseline (default: {d.pairs})",
    )
    drains.add_argument(
        "--http-client",
        choices=("httpx", "aiohttp"),
        default=d.http_client,
        help="HTTP client of our dispatcher in drain-http and latency (drain-noop and "
        "the naive baseline always use an httpx transport, pgqueuer's entrypoint "
        "aiohttp) (default: the dispatcher's)",
    )
    drains.add_argument(
        "--event-loop",
        choices=("auto", "asyncio", "uvloop"),
        default=d.event_loop,
        help="event loop of the drains and the latency scenario, ours and the naive "
        "baseline's alike: auto is uvloop when installed (default: auto)",
    )
    drains.add_argument(
        "--naive-workers",
        type=_positive_int,
        default=d.naive_workers,
        help=f"workers of the naive baseline (default: {d.naive_workers})",
    )
    drains.add_argument(
        "--drain-timeout",
        type=_positive_float,
        default=d.drain_timeout,
        metavar="SECONDS",
        help=f"a drain still running after this fails (default: {d.drain_timeout:g})",
    )
    lat = parser.add_argument_group("latency")
    lat.add_argument(
        "--rate",
        dest="rates",
        type=_list_of(_positive_float),
        default=d.rates,
        metavar="R[,R...]",
        help="offered loads, messages per second, one run each "
        f"(default: {','.join(f'{r:g}' for r in d.rates)})",
    )
    lat.add_argument(
        "--dispatchers",
        type=_list_of(_positive_int),
        default=d.dispatchers,
        metavar="N[,N...]",
        help="dispatcher processes, one run of every rate with each "
        f"(default: {','.join(map(str, d.dispatchers))})",
    )
    lat.add_argument(
        "--duration",
        type=_positive_float,
        default=d.duration,
        metavar="SECONDS",
        help=f"how long the load is offered in each run (default: {d.duration:g})",
    )
    lat.add_argument(
        "--claim-window",
        type=_non_negative_float,
        default=d.claim_window,
        metavar="SECONDS",
        help="the dispatchers' --claim-window: what arrives within it is claimed "
        f"together; 0 claims on every notification (default: {d.claim_window:g})",
    )
    enq = parser.add_argument_group("enqueue")
    enq.add_argument(
        "--enqueue-count",
        type=_positive_int,
        default=d.enqueue_count,
        help=f"enqueues timed with and without NOTIFY (default: {d.enqueue_count})",
    )
    enq.add_argument(
        "--enqueue-batch",
        type=_positive_int,
        default=d.enqueue_batch,
        help=f"enqueues per transaction while timing (default: {d.enqueue_batch})",
    )
    enq.add_argument(
        "--commit-workers",
        type=_positive_ints,
        default=d.commit_workers,
        metavar="N[,N...]",
        help="concurrent business connections; each count is measured in turn "
        f"(default: {_listed(d.commit_workers)})",
    )
    enq.add_argument(
        "--commit-seconds",
        type=_positive_float,
        default=d.commit_seconds,
        metavar="SECONDS",
        help=f"length of each commit-throughput phase (default: {d.commit_seconds:g})",
    )
    enq.add_argument(
        "--commit-rounds",
        type=_positive_int,
        default=d.commit_rounds,
        help="rounds of (plain, floor, outbox, outbox without NOTIFY) "
        f"(default: {d.commit_rounds})",
    )
    lag = parser.add_argument_group("commit-latency")
    lag.add_argument(
        "--commit-rates",
        type=_positive_floats,
        default=d.commit_rates,
        metavar="R[,R...]",
        help="offered business transactions per second, each measured in turn "
        f"(default: {_listed(d.commit_rates)})",
    )
    lag.add_argument(
        "--commit-producers",
        type=_positive_int,
        default=d.commit_producers,
        help=f"producer connections sharing the offered rate (default: {d.commit_producers})",
    )
    lag.add_argument(
        "--commit-rate-seconds",
        type=_positive_float,
        default=d.commit_rate_seconds,
        metavar="SECONDS",
        help=f"how long each rate is offered (default: {d.commit_rate_seconds:g})",
    )
    lag.add_argument(
        "--commit-dispatcher",
        choices=("off", "on", "both"),
        default=d.commit_dispatcher,
        help="run a dispatcher (LISTEN on, no network) consuming while the load is "
        f"offered: off, on, or each rate both ways (default: {d.commit_dispatcher})",
    )
    hist = parser.add_argument_group("history")
    hist.add_argument(
        "--history-rows",
        type=_positive_int,
        default=d.history_rows,
        help=f"delivered messages in the history (default: {d.history_rows})",
    )
    hist.add_argument(
        "--history-messages",
        type=_positive_int,
        default=d.history_messages,
        help=f"messages per history drain (default: {d.history_messages})",
    )
    hist.add_argument(
        "--history-rounds",
        type=_positive_int,
        default=d.history_rounds,
        help=f"(empty, full) drains, alternating (default: {d.history_rounds})",
    )
    mem = parser.add_argument_group(
        "memory (drain-http at concurrency 256 and 1,024, some responses huge: peak RSS)"
    )
    mem.add_argument(
        "--memory-messages",
        type=_positive_int,
        default=d.memory_messages,
        help=f"messages per memory drain (default: {d.memory_messages})",
    )
    mem.add_argument(
        "--memory-delay",
        type=_positive_float,
        default=d.memory_delay,
        metavar="SECONDS",
        help="the receiver answers each request this late, so that requests pile up "
        f"to the concurrency (default: {d.memory_delay:g})",
    )
    mem.add_argument(
        "--big-response-share",
        type=_share,
        default=d.big_response_share,
        metavar="FRACTION",
        help="share of the receiver's responses that carry a big body, 0 to 1 "
        f"(default: {d.big_response_share:g}, every {1 / d.big_response_share:g}th)",
    )
    mem.add_argument(
        "--big-response-mb",
        type=_positive_float,
        default=d.big_response_mb,
        metavar="MB",
        help="length of a big body in MB (10^6 bytes), streamed by the receiver; the "
        f"dispatcher reads only its bound of it (default: {d.big_response_mb:g})",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The :class:`Settings` named by parsed ``outbox bench`` options."""
    values = {f.name: getattr(args, f.name) for f in fields(Settings)}
    values["baselines"] = tuple(dict.fromkeys(values["baselines"]))  # once each, in order
    return Settings(**values)
