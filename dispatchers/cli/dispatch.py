"""``outbox dispatch``: run a dispatcher process, or several on this host."""

from __future__ import annotations

import argparse
import sys

from dispatchers.cli._common import (
    Commands,
    add_database_options,
    non_negative_float,
    parse_duration,
    positive_float,
    positive_int,
    require_extra,
    resolve_database,
)
from dispatchers.loop import EVENT_LOOPS


def cmd_dispatch(args: argparse.Namespace) -> int:
    require_extra("dispatcher")
    from dispatchers.config import DispatcherConfig
    from dispatchers.log import EventLog
    from dispatchers.loop import resolve as resolve_event_loop
    from dispatchers.pool import run_dispatcher
    from dispatchers.retry import ExponentialBackoff

    config = DispatcherConfig(
        schema=args.schema,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        lease=args.lease,
        request_timeout=args.request_timeout,
        connect_timeout=min(args.connect_timeout, args.request_timeout),
        claim_timeout=args.claim_timeout,
        statement_timeout=args.statement_timeout,
        lock_timeout=args.lock_timeout,
        retry_policy=ExponentialBackoff(base=args.retry_base, cap=args.retry_cap),
        grace=args.grace,
        poll_interval=args.poll_interval,
        claim_window=args.claim_window,
        listen=args.listen,
        prepared_statements=args.prepared_statements,
        allow_private_networks=args.allow_private_networks,
        allow_networks=tuple(args.allow_network),
        idempotency_key_format=args.idempotency_key_format,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        retention=args.retention,
        http_client=args.http_client or DispatcherConfig.http_client,
        event_loop=args.event_loop or DispatcherConfig.event_loop,
    )
    log = EventLog(format=args.log_format, level=args.log_level)
    resolve_event_loop(config.event_loop)  # a missing uvloop fails here, once, not per child
    db = resolve_database(args)
    if args.processes > 1:
        from dispatchers.supervisor import supervise

        return supervise(args.argv, db.url, args.processes, drain=args.drain)
    stats = run_dispatcher(db.url, config, drain=args.drain, log=log)
    print(
        f"outbox dispatch: stopped; delivered {stats.delivered}, retried {stats.retried}, "
        f"dead {stats.dead}, released {stats.released}, leases lost {stats.lease_lost}",
        file=sys.stderr,
    )
    return 0


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "dispatch",
        help="run a dispatcher: claim ready messages and deliver them over HTTP",
        description="Run a dispatcher process. Run more copies (on any hosts) to scale "
        "out; each claims with leases, so no two deliver the same message at once. "
        "SIGTERM or SIGINT stops claiming at once and gives in-flight deliveries "
        "--grace seconds before releasing them.",
    )
    add_database_options(p)
    p.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        help="run this many dispatcher processes on this host (one core each); they "
        "share the work as separate hosts would (default: 1)",
    )
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=64,
        help="HTTP requests in flight at once; messages awaiting their outcome write "
        "stay leased too, up to as many again (default: 64)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=100,
        help="most messages claimed by one statement (default: 100)",
    )
    p.add_argument(
        "--lease",
        type=positive_float,
        default=30.0,
        help="lease length in seconds, renewed every third (default: 30)",
    )
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=10.0,
        help="bound on one HTTP attempt, connect to last byte (default: 10)",
    )
    p.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=5.0,
        help="bound on opening a connection (default: 5)",
    )
    p.add_argument(
        "--claim-timeout",
        type=positive_float,
        default=2.0,
        help="bound on the claim statement, in seconds (default: 2)",
    )
    p.add_argument(
        "--statement-timeout",
        type=positive_float,
        default=3.0,
        help="bound on every other statement, in seconds (default: 3)",
    )
    p.add_argument(
        "--lock-timeout",
        type=positive_float,
        default=1.0,
        help="bound on waiting for a row lock, in seconds (default: 1)",
    )
    p.add_argument(
        "--retry-base",
        type=positive_float,
        default=2.0,
        help="delay before the first retry of a failed delivery, in seconds; it doubles "
        "with each attempt, with jitter (default: 2)",
    )
    p.add_argument(
        "--retry-cap",
        type=positive_float,
        default=3600.0,
        help="longest delay between retries, in seconds (default: 3600)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds in-flight deliveries get at shutdown (default: 10)",
    )
    p.add_argument(
        "--poll-interval",
        type=positive_float,
        default=1.0,
        help="seconds between polls when no notification arrives (default: 1)",
    )
    p.add_argument(
        "--claim-window",
        type=non_negative_float,
        default=0.005,
        help="shortest seconds between two claims while messages keep arriving: what "
        "arrives within it is claimed together, which costs the database less per "
        "message and adds up to this much latency; 0 claims on every notification "
        "(default: 0.005)",
    )
    p.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="do not LISTEN for enqueue notifications; poll only "
        "(needed behind PgBouncer in transaction mode)",
    )
    p.add_argument(
        "--no-prepared-statements",
        dest="prepared_statements",
        action="store_false",
        help="plan every statement at every execution instead of once per server "
        "connection (prepared statements also work behind PgBouncer: a statement "
        "missing on a server connection is prepared again)",
    )
    p.add_argument("--drain", action="store_true", help="exit 0 once no message is due or running")
    p.add_argument(
        "--allow-private-networks",
        action="store_true",
        help="turn the SSRF guard off: allow loopback and private addresses",
    )
    p.add_argument(
        "--allow-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="allow this non-public network (repeatable), e.g. 10.0.0.0/8",
    )
    p.add_argument(
        "--idempotency-key-format",
        choices=("structured", "raw"),
        default="structured",
        help='Idempotency-Key as an RFC 8941 string ("key", per the IETF '
        "draft; default) or the raw key",
    )
    p.add_argument(
        "--http-client",
        choices=("httpx", "aiohttp"),
        default=None,
        help="HTTP client that sends, both behind the SSRF guard (default: aiohttp, "
        "which costs about a quarter of httpx's CPU per request)",
    )
    p.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=None,
        help="event loop to run on: uvloop (about 7%% less CPU per delivery; "
        "pip install 'outbox[fast]') or asyncio's own; auto uses uvloop when it is "
        "installed (default: auto)",
    )
    p.add_argument(
        "--retention",
        type=parse_duration,
        default=7 * 86400.0,
        metavar="SPAN",
        help="delete delivered messages, their attempts and keys this long after "
        "delivery, in small batches (default: 7d; dead messages are kept until purged)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus /metrics and /healthz on this port (default: off)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address for --metrics-port (default: 127.0.0.1; 0.0.0.0 in a container)",
    )
    p.add_argument(
        "--log-format",
        choices=("json", "text"),
        default=None,
        help="json lines (default when stdout is not a terminal) or text",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="least important event to log (default: info)",
    )
    p.set_defaults(handler=cmd_dispatch)
