"""``outbox bench``: throughput and latency on this machine (the benchmark itself
is :mod:`dispatchers.bench`; its runner is imported only when the command runs).

The options map one to one onto :class:`~dispatchers.bench.Settings` fields,
whose defaults they show.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

from dispatchers.bench import (
    BASELINE_NAMES,
    DEFAULT_SCENARIOS,
    LATENCY_SECONDS,
    SCENARIO_NAMES,
    SOAK_SECONDS,
    Settings,
)
from dispatchers.cli._common import (
    Commands,
    fraction,
    list_of,
    non_negative_float,
    positive_float,
    positive_int,
    require_extra,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.runtime.config import HTTP_CLIENTS
from dispatchers.runtime.loop import EVENT_LOOPS


def cmd_bench(args: argparse.Namespace) -> ExitCode:
    require_extra("dispatcher")
    if not args.database_url:
        require_extra("embedded")
    settings = settings_from_args(args)
    if "pgqueuer" in settings.baselines:
        require_extra("bench")
    from dispatchers.bench.runner import main as run_bench

    ok = run_bench(
        settings,
        scenarios=list(dict.fromkeys(args.scenario or DEFAULT_SCENARIOS)),
        database_url=args.database_url,
        json_output=args.json,
    )
    return ExitCode.OK if ok else ExitCode.FAILURE


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "bench",
        help="measure throughput and latency on this machine (throwaway database)",
        description="Run benchmark scenarios, each in a fresh schema dropped afterwards, "
        "against a throwaway embedded PostgreSQL (or --database-url), with a fast "
        "receiver on 127.0.0.1 in its own process. Prints one table (or --json). Exit "
        "status 1 only if a message was lost or delivered twice; missed targets are "
        "reported, not failed.",
    )
    _add_options(p)
    p.set_defaults(handler=cmd_bench, name="bench")


def _listed(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:g}" for v in values)


def _add_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``outbox bench``, with :class:`Settings`' defaults."""
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
        help=f"run this scenario (repeatable; default: all of {', '.join(DEFAULT_SCENARIOS)}; "
        "soak runs only when named)",
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
    parser.add_argument(
        "--duration",
        type=positive_float,
        default=d.duration,
        metavar="SECONDS",
        help="how long the load is offered: in each latency run (default: "
        f"{LATENCY_SECONDS:g}) and in the soak (default: {SOAK_SECONDS:g})",
    )
    drains = parser.add_argument_group("drain-http, drain-noop")
    drains.add_argument(
        "-n",
        "--messages",
        type=positive_int,
        default=d.messages,
        help=f"messages per drain (default: {d.messages})",
    )
    drains.add_argument(
        "--concurrency",
        type=positive_int,
        default=d.concurrency,
        help=f"dispatcher concurrency (default: {d.concurrency})",
    )
    drains.add_argument(
        "--batch-size",
        type=positive_int,
        default=d.batch_size,
        help=f"dispatcher claim batch (default: {d.batch_size})",
    )
    drains.add_argument(
        "--destinations",
        type=positive_int,
        default=d.destinations,
        metavar="N",
        help="spread the drain-http messages over N destinations, in turn: the receiver "
        f"listens on N ports of 127.0.0.1, at most 1000 (default: {d.destinations})",
    )
    drains.add_argument(
        "--repeat",
        type=positive_int,
        default=d.repeat,
        help=f"drains per scenario without a baseline (default: {d.repeat})",
    )
    drains.add_argument(
        "--pairs",
        type=positive_int,
        default=d.pairs,
        help=f"rounds of ours and each baseline's with --baseline (default: {d.pairs})",
    )
    drains.add_argument(
        "--http-client",
        choices=HTTP_CLIENTS,
        default=d.http_client,
        help="HTTP client of our dispatcher in drain-http and latency (drain-noop and "
        "the naive baseline always use an httpx transport, pgqueuer's entrypoint "
        "aiohttp) (default: the dispatcher's)",
    )
    drains.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=d.event_loop,
        help="event loop of the drains and the latency scenario, ours and the naive "
        "baseline's alike: auto is uvloop when installed (default: auto)",
    )
    drains.add_argument(
        "--trace",
        action="store_true",
        help="our dispatcher records an OpenTelemetry span per attempt (spans are "
        "batched and dropped, not exported; needs opentelemetry-sdk), to measure "
        "what tracing costs",
    )
    drains.add_argument(
        "--naive-workers",
        type=positive_int,
        default=d.naive_workers,
        help=f"workers of the naive baseline (default: {d.naive_workers})",
    )
    drains.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=d.drain_timeout,
        metavar="SECONDS",
        help=f"a drain still running after this fails (default: {d.drain_timeout:g})",
    )
    lat = parser.add_argument_group("latency")
    lat.add_argument(
        "--rate",
        dest="rates",
        type=list_of(positive_float),
        default=d.rates,
        metavar="R[,R...]",
        help=f"offered loads, messages per second, one run each (default: {_listed(d.rates)})",
    )
    lat.add_argument(
        "--dispatchers",
        type=list_of(positive_int),
        default=d.dispatchers,
        metavar="N[,N...]",
        help="dispatcher processes, one run of every rate with each "
        f"(default: {_listed(d.dispatchers)})",
    )
    lat.add_argument(
        "--claim-window",
        type=non_negative_float,
        default=d.claim_window,
        metavar="SECONDS",
        help="the dispatchers' --claim-window: what arrives within it is claimed "
        f"together; 0 claims on every notification (default: {d.claim_window:g})",
    )
    enq = parser.add_argument_group("enqueue")
    enq.add_argument(
        "--enqueue-count",
        type=positive_int,
        default=d.enqueue_count,
        help=f"enqueues timed with and without NOTIFY (default: {d.enqueue_count})",
    )
    enq.add_argument(
        "--enqueue-batch",
        type=positive_int,
        default=d.enqueue_batch,
        help=f"enqueues per transaction while timing (default: {d.enqueue_batch})",
    )
    enq.add_argument(
        "--commit-workers",
        type=list_of(positive_int),
        default=d.commit_workers,
        metavar="N[,N...]",
        help="concurrent business connections; each count is measured in turn "
        f"(default: {_listed(d.commit_workers)})",
    )
    enq.add_argument(
        "--commit-seconds",
        type=positive_float,
        default=d.commit_seconds,
        metavar="SECONDS",
        help=f"length of each commit-throughput phase (default: {d.commit_seconds:g})",
    )
    enq.add_argument(
        "--commit-rounds",
        type=positive_int,
        default=d.commit_rounds,
        help="rounds of (plain, floor, outbox, outbox without NOTIFY) "
        f"(default: {d.commit_rounds})",
    )
    lag = parser.add_argument_group("commit-latency")
    lag.add_argument(
        "--commit-rates",
        type=list_of(positive_float),
        default=d.commit_rates,
        metavar="R[,R...]",
        help="offered business transactions per second, each measured in turn "
        f"(default: {_listed(d.commit_rates)})",
    )
    lag.add_argument(
        "--commit-producers",
        type=positive_int,
        default=d.commit_producers,
        help=f"producer connections sharing the offered rate (default: {d.commit_producers})",
    )
    lag.add_argument(
        "--commit-rate-seconds",
        type=positive_float,
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
        type=positive_int,
        default=d.history_rows,
        help=f"delivered messages in the history (default: {d.history_rows})",
    )
    hist.add_argument(
        "--history-messages",
        type=positive_int,
        default=d.history_messages,
        help=f"messages per history drain (default: {d.history_messages})",
    )
    hist.add_argument(
        "--history-rounds",
        type=positive_int,
        default=d.history_rounds,
        help=f"(empty, full) drains, alternating (default: {d.history_rounds})",
    )
    mem = parser.add_argument_group(
        "memory (drain-http at concurrency 256 and 1,024, some responses huge: peak RSS)"
    )
    mem.add_argument(
        "--memory-messages",
        type=positive_int,
        default=d.memory_messages,
        help=f"messages per memory drain (default: {d.memory_messages})",
    )
    mem.add_argument(
        "--memory-delay",
        type=positive_float,
        default=d.memory_delay,
        metavar="SECONDS",
        help="the receiver answers each request this late, so that requests pile up "
        f"to the concurrency (default: {d.memory_delay:g})",
    )
    mem.add_argument(
        "--big-response-share",
        type=fraction,
        default=d.big_response_share,
        metavar="FRACTION",
        help="share of the receiver's responses that carry a big body, 0 to 1 "
        f"(default: {d.big_response_share:g}, every {1 / d.big_response_share:g}th)",
    )
    mem.add_argument(
        "--big-response-mb",
        type=positive_float,
        default=d.big_response_mb,
        metavar="MB",
        help="length of a big body in MB (10^6 bytes), streamed by the receiver; the "
        f"dispatcher reads only its bound of it (default: {d.big_response_mb:g})",
    )
    _add_soak_options(parser, d)


def _add_soak_options(parser: argparse.ArgumentParser, d: Settings) -> None:
    soak = parser.add_argument_group(
        "soak (run only when named: a steady load for minutes through receiver failures "
        "and dispatcher restarts; --duration sets its length)"
    )
    soak.add_argument(
        "--soak-rate",
        type=positive_float,
        default=d.soak_rate,
        metavar="R",
        help=f"messages committed per second, one per transaction (default: {d.soak_rate:g})",
    )
    soak.add_argument(
        "--soak-dispatchers",
        type=positive_int,
        default=d.soak_dispatchers,
        metavar="N",
        help="outbox dispatch processes; the last is restarted (SIGTERM, then started "
        f"again) after every interval (default: {d.soak_dispatchers})",
    )
    soak.add_argument(
        "--soak-interval",
        type=positive_float,
        default=d.soak_interval,
        metavar="SECONDS",
        help=f"length of each reported interval (default: {d.soak_interval:g})",
    )
    soak.add_argument(
        "--soak-fail-share",
        type=fraction,
        default=d.soak_fail_share,
        metavar="FRACTION",
        help=f"share of requests the receiver answers 500 (default: {d.soak_fail_share:g})",
    )
    soak.add_argument(
        "--soak-slow-share",
        type=fraction,
        default=d.soak_slow_share,
        metavar="FRACTION",
        help=f"share of requests the receiver answers late (default: {d.soak_slow_share:g})",
    )
    soak.add_argument(
        "--soak-slow-delay",
        type=positive_float,
        default=d.soak_slow_delay,
        metavar="SECONDS",
        help=f"how late those answers are (default: {d.soak_slow_delay:g})",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The :class:`Settings` named by parsed ``outbox bench`` options."""
    values = {f.name: getattr(args, f.name) for f in fields(Settings)}
    values["baselines"] = tuple(dict.fromkeys(values["baselines"]))  # once each, in order
    return Settings(**values)
