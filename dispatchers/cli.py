"""The ``outbox`` command line.

Environment variables are read here and nowhere else. The database is the one
given by ``--database-url``, else ``OUTBOX_DATABASE_URL``, else ``DATABASE_URL``,
else an embedded PostgreSQL kept in ``./.outbox/pg`` (``OUTBOX_EMBEDDED_DIR``
moves it).

Operator commands (``endpoints``, ``dead``, ``replay``, ``messages``,
``status``) each do their work in one transaction and commit it. Bad input
exits 2 with a message naming the field, having written nothing; a database
error exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from dispatchers.loop import EVENT_LOOPS
from outbox.dsn import libpq_url, redact
from outbox.errors import InvalidMessage, OutboxError

if TYPE_CHECKING:
    from outbox.endpoints import Endpoint

Handler = Callable[[argparse.Namespace], int]


@dataclass
class Database:
    """The database a command talks to, and whether it is the embedded one."""

    url: str
    embedded: bool


def resolve_database(args: argparse.Namespace) -> Database:
    """Pick the database URL by the documented precedence, starting the embedded
    server when none is configured (and saying so on stderr)."""
    for value in (
        getattr(args, "database_url", None),
        os.environ.get("OUTBOX_DATABASE_URL"),
        os.environ.get("DATABASE_URL"),
    ):
        if value:
            return Database(libpq_url(value), embedded=False)
    from outbox.embedded import DEFAULT_PATH, EmbeddedPostgres

    path = os.environ.get("OUTBOX_EMBEDDED_DIR") or str(DEFAULT_PATH)
    print(
        f"outbox: no database URL given; using the embedded PostgreSQL in {path}",
        file=sys.stderr,
    )
    return Database(EmbeddedPostgres(path).url, embedded=True)


class UsageError(OutboxError):
    """A command line that cannot be carried out as given (exit status 2)."""


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return str(value)


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON with ``--json``, else the human-readable ``text``."""
    if getattr(args, "json", False):
        print(json.dumps(data, default=_json_default, indent=2))
    else:
        print(text)


def add_database_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, $DATABASE_URL, "
        "else the embedded server in ./.outbox/pg)",
    )
    parser.add_argument(
        "--schema", default="outbox", help="schema of the outbox tables (default: outbox)"
    )


def cmd_migrate(args: argparse.Namespace) -> int:
    from outbox.migrations import applied_versions, load_migrations, migrate

    db = resolve_database(args)
    migrations = load_migrations()
    applied = migrate(db.url, schema=args.schema, migrations=migrations)
    versions = applied_versions(db.url, schema=args.schema)
    names = [f"{m.version:04d}_{m.name}" for m in applied]
    text = (
        f"applied {len(applied)} migration(s) to schema {args.schema!r}: {', '.join(names)}"
        if applied
        else f"schema {args.schema!r} is up to date (version {versions[-1] if versions else 0})"
    )
    emit(
        args,
        {
            "schema": args.schema,
            "database": redact(db.url),
            "applied": names,
            "version": versions[-1] if versions else 0,
        },
        text,
    )
    return 0


def cmd_dispatch(args: argparse.Namespace) -> int:
    from dispatchers.config import DispatcherConfig
    from dispatchers.dispatcher import run_dispatcher
    from dispatchers.log import EventLog
    from dispatchers.loop import resolve as resolve_event_loop
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


def cmd_demo(args: argparse.Namespace) -> int:
    from dispatchers.demo import run_demo

    db = resolve_database(args)
    return run_demo(db.url, events=args.events, rate=args.rate, seed=args.seed)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def add_dispatch_parser(sub: Any) -> None:
    p = sub.add_parser(
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


# -- operator commands: shared helpers ------------------------------------------


@contextlib.contextmanager
def transaction(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    """One transaction for one command: committed when the block ends, rolled
    back (nothing written) when it raises."""
    db = resolve_database(args)
    with psycopg.connect(db.url, connect_timeout=10) as conn:
        yield conn


_RELATIVE_TIME = re.compile(r"^(\d{1,9})([smhdw])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds from a span such as ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``."""
    match = _RELATIVE_TIME.match(text.strip())
    if not match or int(match[1]) == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive span like 30m, 12h or 7d (units s, m, h, d, w)"
        )
    return float(int(match[1]) * _UNIT_SECONDS[match[2]])


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """An aware datetime from ISO 8601 with an offset or ``Z``, or from a span
    ago such as ``30m``, ``2h``, ``7d`` (units s, m, h, d, w)."""
    match = _RELATIVE_TIME.match(text.strip())
    if match:
        span = timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])
        return (now or datetime.now(UTC)) - span
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time (2024-05-01T12:00:00Z) nor a span "
            "ago like 30m, 2h or 7d"
        ) from None
    if value.utcoffset() is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no UTC offset: add one (+02:00) or Z, so it means one instant"
        )
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number, 0 or more")
    return value


def parse_metadata(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidMessage("metadata", f"is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InvalidMessage("metadata", "must be a JSON object")
    return value


_UNPRINTABLE = re.compile(r"[^\x20-\x7e\u00a0-\uffff]")
_UNPRINTABLE_TEXT = re.compile(r"[^\n\t\x20-\x7e\u00a0-\uffff]")


def cell(value: object, width: int = 60) -> str:
    """One table cell: times in UTC, None as ``-``, control characters (which a
    remote server could put in an error or excerpt) replaced, long text cut."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, float):
        return f"{value:.1f}"
    text = _UNPRINTABLE.sub("?", " ".join(str(value).split()))
    return text if len(text) <= width else text[: width - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Rows as aligned columns under ``headers``; numbers right-aligned."""
    raw = [list(r) for r in rows]
    cells = [[cell(v) for v in r] for r in raw]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    numeric = [
        all(isinstance(r[i], int) and not isinstance(r[i], bool) for r in raw if r[i] is not None)
        and any(r[i] is not None for r in raw)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def fields(pairs: Sequence[tuple[str, object]]) -> str:
    """``label  value`` lines with the values aligned."""
    width = max(len(label) for label, _ in pairs)
    return "\n".join(f"{label.ljust(width)}  {cell(value, 200)}".rstrip() for label, value in pairs)


def confirm(args: argparse.Namespace, action: str, question: Callable[[], str]) -> bool:
    """True with ``--yes``; otherwise ask on the terminal (``question`` is built
    only then, so it may query the database). Without a terminal, refuse."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to {action} without --yes (stdin is not a terminal to ask on)")
    print(f"{question()} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline().strip().lower()
    if answer in ("y", "yes"):
        return True
    print("aborted; nothing changed", file=sys.stderr)
    return False


# -- outbox endpoints ---------------------------------------------------------


def _endpoint_fields(ep: Endpoint, *, show_secrets: bool) -> str:
    pairs: list[tuple[str, object]] = [
        ("id", ep.id),
        ("url", ep.url),
        ("description", ep.description or None),
        ("event types", ", ".join(ep.event_types) or "* (every event type)"),
        ("enabled", "yes" if ep.enabled else f"no: {ep.disabled_reason or 'disabled'}"),
    ]
    if not ep.enabled:
        pairs.append(("disabled at", ep.disabled_at))
    pairs += [
        ("failure streak", ep.failure_streak),
        ("failing since", ep.failing_since),
        ("last success", ep.last_success_at),
        ("max concurrency", ep.max_concurrency),
        ("metadata", json.dumps(ep.metadata) if ep.metadata else None),
    ]
    for i, secret in enumerate(ep.secrets):
        shown = secret.secret if show_secrets else secret.secret[:10] + "…"
        until = f" (signs until {cell(secret.expires_at)})" if secret.expires_at else ""
        pairs.append(("secrets" if i == 0 else "", shown + until))
    pairs += [("created", ep.created_at), ("updated", ep.updated_at)]
    return fields(pairs)


def cmd_endpoints_add(args: argparse.Namespace) -> int:
    from outbox.endpoints import Endpoints

    metadata = parse_metadata(args.metadata)
    with transaction(args) as conn:
        ep = Endpoints(schema=args.schema).add(
            conn,
            url=args.url,
            event_types=args.event_types,
            secret=args.secret,
            description=args.description,
            metadata=metadata,
            max_concurrency=args.max_concurrency,
        )
    secret = ep.secrets[0].secret
    emit(
        args,
        {**ep.as_dict(show_secrets=True), "secret": secret},
        f"created endpoint {ep.id}: {ep.url}\n"
        f"signing secret: {secret}\n"
        "(shown in full only here; `outbox endpoints show "
        f"{ep.id} --show-secrets` prints it again)",
    )
    return 0


def cmd_endpoints_list(args: argparse.Namespace) -> int:
    from outbox.endpoints import Endpoints

    with transaction(args) as conn:
        endpoints = Endpoints(schema=args.schema).all(conn)
    rows = [
        (
            ep.id,
            ep.url,
            ep.enabled,
            ", ".join(ep.event_types) or "*",
            ep.failure_streak,
            ep.last_success_at,
            ep.description,
        )
        for ep in endpoints
    ]
    text = (
        table(
            ["ID", "URL", "ENABLED", "EVENT TYPES", "FAILURES", "LAST SUCCESS", "DESCRIPTION"],
            rows,
        )
        if rows
        else "no endpoints"
    )
    emit(args, [ep.as_dict() for ep in endpoints], text)
    return 0


def cmd_endpoints_show(args: argparse.Namespace) -> int:
    from outbox.endpoints import Endpoints

    with transaction(args) as conn:
        ep = Endpoints(schema=args.schema).require(conn, args.id)
    emit(
        args,
        ep.as_dict(show_secrets=args.show_secrets),
        _endpoint_fields(ep, show_secrets=args.show_secrets),
    )
    return 0


def cmd_endpoints_update(args: argparse.Namespace) -> int:
    from outbox.endpoints import Endpoints

    if args.event_types is not None and args.all_event_types:
        raise UsageError("give --event-type or --all-event-types, not both")
    if args.max_concurrency is not None and args.no_max_concurrency:
        raise UsageError("give --max-concurrency or --no-max-concurrency, not both")
    event_types = [] if args.all_event_types else args.event_types
    changes = (
        args.url,
        event_types,
        args.description,
        args.metadata,
        args.max_concurrency,
        args.no_max_concurrency or None,
    )
    if all(c is None for c in changes):
        raise UsageError(
            "nothing to change: give --url, --event-type, --all-event-types, --description, "
            "--metadata, --max-concurrency or --no-max-concurrency"
        )
    metadata = parse_metadata(args.metadata)
    with transaction(args) as conn:
        ep = Endpoints(schema=args.schema).update(
            conn,
            args.id,
            url=args.url,
            event_types=event_types,
            description=args.description,
            metadata=metadata,
            max_concurrency=args.max_concurrency,
            clear_max_concurrency=args.no_max_concurrency,
        )
    emit(
        args, ep.as_dict(), f"updated endpoint {ep.id}\n{_endpoint_fields(ep, show_secrets=False)}"
    )
    return 0


def cmd_endpoints_disable(args: argparse.Namespace) -> int:
    from outbox.endpoints import Endpoints

    with transaction(args) as conn:
        paused = Endpoints(schema=args.schema).disable(conn, args.id, reason=args.reason)
    emit(
        args,
        {"id": args.id, "enabled": False, "paused": paused},
        f"disabled endpoint {args.id}; paused {paused} waiting message(s)",
    )
    return 0


def cmd_endpoints_enable(args: argparse.Namespace) -> int:
    from outbox.endpoints import Endpoints

    with transaction(args) as conn:
        resumed = Endpoints(schema=args.schema).enable(conn, args.id)
    emit(
        args,
        {"id": args.id, "enabled": True, "resumed": resumed},
        f"enabled endpoint {args.id}; resumed {resumed} paused message(s)",
    )
    return 0


def cmd_endpoints_rotate_secret(args: argparse.Namespace) -> int:
    from outbox.endpoints import Endpoints

    overlap = timedelta(hours=args.overlap)
    with transaction(args) as conn:
        ep = Endpoints(schema=args.schema).rotate_secret(
            conn, args.id, secret=args.secret, overlap=overlap
        )
    new = ep.secrets[0].secret
    previous = [s.expires_at for s in ep.secrets[1:] if s.expires_at is not None]
    until = f"\nthe previous secret(s) keep signing until {cell(max(previous))}" if previous else ""
    emit(
        args,
        {"id": ep.id, "secret": new, "previous_secrets_expire_at": max(previous, default=None)},
        f"new signing secret for endpoint {ep.id}: {new}{until}",
    )
    return 0


def cmd_endpoints_delete(args: argparse.Namespace) -> int:
    from outbox.endpoints import Endpoints

    endpoints = Endpoints(schema=args.schema)

    def question() -> str:
        with transaction(args) as conn:
            ep = endpoints.require(conn, args.id)
        return (
            f"Delete endpoint {ep.id} ({ep.url})? Its waiting messages become dead; "
            "delivered history is kept."
        )

    if not confirm(args, f"delete endpoint {args.id}", question):
        return 1
    with transaction(args) as conn:
        had = endpoints.delete(conn, args.id)
    emit(
        args,
        {"id": args.id, "deleted": True, "messages": had},
        f"deleted endpoint {args.id} ({had} message(s) of it were in the outbox; "
        "the waiting ones are now dead)",
    )
    return 0


def add_endpoints_parser(sub: Any) -> None:
    group = sub.add_parser(
        "endpoints",
        help="manage webhook endpoints",
        description="Webhook endpoints: where published events are delivered, signed "
        "with the endpoint's secrets (Standard Webhooks).",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, handler: Handler, help: str, json_output: bool = True) -> Any:
        p = actions.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        add_database_options(p)
        if json_output:
            p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(handler=handler, name=f"endpoints {name}")
        return p

    def fields_options(p: Any, *, update: bool) -> None:
        p.add_argument(
            "--event-type",
            dest="event_types",
            action="append",
            default=None,
            metavar="TYPE",
            help="subscribe to this event type or prefix.* pattern (repeatable; "
            + ("replaces the list)" if update else "default: every event type)"),
        )
        p.add_argument("--description", default=None if update else "", help="free text")
        p.add_argument("--metadata", metavar="JSON", help="a JSON object stored with it")
        p.add_argument(
            "--max-concurrency",
            type=positive_int,
            metavar="N",
            help="most deliveries in flight to it at once",
        )

    p = action("add", cmd_endpoints_add, "register an endpoint; prints its id and secret")
    p.add_argument("url", metavar="URL", help="http(s) URL to POST events to")
    fields_options(p, update=False)
    p.add_argument("--secret", help="whsec_... signing secret (default: a new random one)")

    action("list", cmd_endpoints_list, "list the endpoints")

    p = action("show", cmd_endpoints_show, "show one endpoint")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--show-secrets", action="store_true", help="print the secrets in full")

    p = action("update", cmd_endpoints_update, "change an endpoint's settings")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--url", help="new http(s) URL")
    fields_options(p, update=True)
    p.add_argument("--all-event-types", action="store_true", help="subscribe to every event type")
    p.add_argument("--no-max-concurrency", action="store_true", help="remove the cap")

    p = action("disable", cmd_endpoints_disable, "stop delivering to an endpoint")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--reason", default="disabled by an operator", help="why (shown in status)")

    p = action("enable", cmd_endpoints_enable, "resume delivering to an endpoint")
    p.add_argument("id", type=positive_int, metavar="ID")

    p = action(
        "rotate-secret",
        cmd_endpoints_rotate_secret,
        "sign with a new secret; the old ones keep signing during the overlap",
    )
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--secret", help="the new whsec_... secret (default: a new random one)")
    p.add_argument(
        "--overlap",
        type=non_negative_float,
        default=24.0,
        metavar="HOURS",
        help="hours the previous secrets keep signing (default: 24)",
    )

    p = action("delete", cmd_endpoints_delete, "delete an endpoint (its waiting messages die)")
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")


# -- outbox dead ----------------------------------------------------------------


def _dead_selection(args: argparse.Namespace) -> dict[str, Any]:
    filters = {
        "endpoint_id": args.endpoint,
        "event_type": args.event_type,
        "since": args.since,
    }
    given = bool(args.ids) or any(v is not None for v in filters.values())
    if args.all and given:
        raise UsageError("--all cannot be combined with message IDs or filters")
    if not args.all and not given:
        raise UsageError("give message IDs, a filter (--endpoint, --event-type, --since) or --all")
    return {"ids": args.ids or None, **filters, "all_": args.all}


def cmd_dead_list(args: argparse.Namespace) -> int:
    from outbox.admin import dead_list

    with transaction(args) as conn:
        dead = dead_list(
            conn,
            schema=args.schema,
            endpoint_id=args.endpoint,
            event_type=args.event_type,
            since=args.since,
            limit=args.limit,
        )
    rows = [
        (
            m.id,
            m.completed_at,
            f"{m.attempts}/{m.max_attempts}",
            m.last_status,
            m.endpoint_id,
            m.event_type,
            cell(m.url, 40),
            cell(m.last_error, 50),
        )
        for m in dead
    ]
    text = (
        table(["ID", "DIED", "ATTEMPTS", "STATUS", "ENDPOINT", "EVENT", "URL", "ERROR"], rows)
        if rows
        else "no dead messages"
    )
    if len(dead) == args.limit:
        text += f"\n(showing the newest {args.limit}; --limit shows more)"
    emit(args, [m.as_dict() for m in dead], text)
    return 0


def cmd_dead_retry(args: argparse.Namespace) -> int:
    from outbox.admin import dead_retry

    selection = _dead_selection(args)
    with transaction(args) as conn:
        count = dead_retry(conn, schema=args.schema, budget=args.attempts, **selection)
    emit(
        args,
        {"retried": count},
        f"retried {count} dead message(s): they are ready now (paused if their endpoint "
        "is disabled), with the same idempotency keys",
    )
    return 0


def cmd_dead_purge(args: argparse.Namespace) -> int:
    from outbox.admin import dead_count, dead_purge

    selection = _dead_selection(args)

    def question() -> str:
        with transaction(args) as conn:
            count = dead_count(conn, schema=args.schema, **selection)
        return f"Delete {count} dead message(s) and their attempt history for good?"

    if not confirm(args, "purge dead messages", question):
        return 1
    with transaction(args) as conn:
        count = dead_purge(conn, schema=args.schema, **selection)
    emit(args, {"purged": count}, f"purged {count} dead message(s)")
    return 0


def add_dead_parser(sub: Any) -> None:
    group = sub.add_parser(
        "dead",
        help="list, retry or purge dead messages",
        description="Dead messages: those that failed permanently or spent their attempts.",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def filters(p: Any) -> None:
        p.add_argument("--endpoint", type=positive_int, metavar="ID", help="of this endpoint")
        p.add_argument("--event-type", metavar="TYPE", help="of this event type")
        p.add_argument(
            "--since",
            type=parse_time,
            metavar="TIME",
            help="that died at or after TIME (ISO 8601 with offset or Z, or 30m, 2h, 7d ago)",
        )

    p = actions.add_parser("list", help="list dead messages, newest first")
    add_database_options(p)
    filters(p)
    p.add_argument(
        "--limit", type=positive_int, default=100, metavar="N", help="at most N (default: 100)"
    )
    p.add_argument("--json", action="store_true", help="print the messages as JSON")
    p.set_defaults(handler=cmd_dead_list, name="dead list")

    for name, handler, help in (
        (
            "retry",
            cmd_dead_retry,
            "send dead messages again (same id and key), with a fresh attempt budget",
        ),
        ("purge", cmd_dead_purge, "delete dead messages and their attempt history"),
    ):
        p = actions.add_parser(
            name,
            help=help,
            description=help[0].upper() + help[1:] + ". Select by IDs, by filters "
            "(all given must match), or --all.",
        )
        add_database_options(p)
        p.add_argument("ids", nargs="*", type=positive_int, metavar="ID", help="message ids")
        filters(p)
        p.add_argument("--all", action="store_true", help="every dead message")
        p.add_argument("--json", action="store_true", help="print the count as JSON")
        if name == "retry":
            p.add_argument(
                "--attempts",
                type=positive_int,
                metavar="N",
                help="attempts each message gets now (default: 8 for webhooks, 12 otherwise)",
            )
        else:
            p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        p.set_defaults(handler=handler, name=f"dead {name}")


# -- outbox replay, messages, status ------------------------------------------------


def cmd_replay(args: argparse.Namespace) -> int:
    from outbox.admin import replay

    with transaction(args) as conn:
        count = replay(
            conn, schema=args.schema, endpoint_id=args.endpoint, since=args.since, until=args.until
        )
    emit(
        args,
        {"replayed": count, "endpoint_id": args.endpoint},
        f"replayed {count} delivered message(s) of endpoint {args.endpoint}: they go out "
        "again with the same webhook-id, so receivers that dedupe ignore them",
    )
    return 0


def cmd_messages_show(args: argparse.Namespace) -> int:
    from outbox.admin import message_show

    with transaction(args) as conn:
        message = message_show(conn, args.id, schema=args.schema)
    if message is None:
        raise InvalidMessage("id", f"no message with id {args.id} (never written, or purged)")
    data = message.as_dict(show_headers=args.show_headers, show_body=args.show_body)
    pairs: list[tuple[str, object]] = [
        ("id", message.id),
        ("state", message.state),
        ("idempotency key", message.idempotency_key),
        ("endpoint", message.endpoint_id),
        ("event type", message.event_type),
        ("request", f"{message.method} {message.url or '-'}"),
        ("content type", message.content_type),
        ("body", f"{len(message.body)} bytes"),
    ]
    for i, (name, value) in enumerate(data["headers"].items()):
        pairs.append(("headers" if i == 0 else "", f"{name}: {value}"))
    pairs += [
        ("ordering key", message.ordering_key),
        ("attempts", f"{message.attempts} of {message.max_attempts}"),
        ("available at", message.available_at),
        (
            "lease",
            f"{message.lease_owner} until {cell(message.lease_until)}"
            if message.lease_owner
            else None,
        ),
        ("last status", message.last_status),
        ("last error", message.last_error),
        ("created", message.created_at),
        ("completed", message.completed_at),
    ]
    text = fields(pairs)
    if message.attempt_log:
        text += "\n\n" + table(
            ["ATTEMPT", "STARTED", "MS", "STATUS", "OUTCOME", "ERROR", "OWNER"],
            [
                (
                    a.attempt,
                    a.started_at,
                    a.duration_ms,
                    a.status,
                    a.outcome,
                    cell(a.error, 50),
                    a.owner,
                )
                for a in message.attempt_log
            ],
        )
    if args.show_body:
        body = data.get("body")
        text += "\n\nbody:\n" + (
            _UNPRINTABLE_TEXT.sub("?", body) if body is not None else "(binary) " + data["body_hex"]
        )
    emit(args, data, text)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch is None:
        return _status_once(args)
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() and not args.json else ""
    try:
        while True:
            if clear:
                sys.stdout.write(clear)
            _status_once(args)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _status_once(args: argparse.Namespace) -> int:
    from outbox.admin import status

    with transaction(args) as conn:
        snapshot = status(conn, schema=args.schema)
    age: float | None = snapshot["oldest_ready_age_s"]
    lagging = args.max_lag is not None and age is not None and age > args.max_lag
    if args.max_lag is not None:
        snapshot["max_lag_s"] = args.max_lag
        snapshot["max_lag_exceeded"] = lagging
    counts = snapshot["messages"]
    recent = snapshot["last_5_minutes"]
    recent["delivered_per_s"] = round(recent["delivered"] / 300, 2)
    text = fields(
        [
            ("ready (due now)", counts["ready"]),
            ("oldest ready waiting", None if age is None else f"{age:.1f} s"),
            ("scheduled (due later)", counts["scheduled"]),
            ("running", counts["running"]),
            ("running, lease expired", counts["lease_expired"]),
            ("paused", counts["paused"]),
            ("dead", counts["dead"]),
            ("delivered, last 5 min", recent["delivered"]),
            ("failed, last 5 min", recent["failed"]),
            ("delivery rate, last 5 min", f"{recent['delivered_per_s']:g}/s"),
        ]
    )
    if snapshot["endpoints"]:
        text += "\n\n" + table(
            ["ENDPOINT", "URL", "ENABLED", "FAILURES", "PENDING", "DEAD", "LAST SUCCESS"],
            [
                (
                    e["id"],
                    cell(e["url"], 50),
                    e["enabled"],
                    e["failure_streak"],
                    e["pending"],
                    e["dead"],
                    e["last_success_at"],
                )
                for e in snapshot["endpoints"]
            ],
        )
    emit(args, snapshot, text)
    if lagging:
        print(
            f"outbox status: the oldest ready message has waited {age:.1f} s, "
            f"more than --max-lag {args.max_lag:g} s",
            file=sys.stderr,
        )
        return 1
    return 0


def add_operator_parsers(sub: Any) -> None:
    add_endpoints_parser(sub)
    add_dead_parser(sub)

    p = sub.add_parser(
        "replay",
        help="send an endpoint's delivered messages again",
        description="Send the messages delivered to one endpoint in a time window again, "
        "with their original webhook-id (receivers that dedupe ignore them). TIME is "
        "ISO 8601 with an offset or Z, or a span ago such as 30m, 2h, 7d.",
    )
    add_database_options(p)
    p.add_argument("--endpoint", type=positive_int, required=True, metavar="ID")
    p.add_argument(
        "--since", type=parse_time, required=True, metavar="TIME", help="delivered at or after TIME"
    )
    p.add_argument("--until", type=parse_time, metavar="TIME", help="delivered before TIME")
    p.add_argument("--json", action="store_true", help="print the count as JSON")
    p.set_defaults(handler=cmd_replay, name="replay")

    group = sub.add_parser("messages", help="inspect messages")
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser(
        "show",
        help="show a message and its attempts",
        description="Show a message (waiting, running, paused, dead or delivered) and "
        "every attempt to deliver it. Header values and the body are hidden unless asked "
        "for: they may hold credentials and personal data.",
    )
    add_database_options(p)
    p.add_argument("id", type=positive_int, metavar="ID")
    p.add_argument("--show-headers", action="store_true", help="print header values")
    p.add_argument("--show-body", action="store_true", help="print the body")
    p.add_argument("--json", action="store_true", help="print the message as JSON")
    p.set_defaults(handler=cmd_messages_show, name="messages show")

    p = sub.add_parser(
        "status",
        help="backlog, lag, lease health and endpoint health",
        description="Counts by state, how long the oldest due message has waited, "
        "recent deliveries and failures, and the health of each endpoint.",
    )
    add_database_options(p)
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.add_argument(
        "--max-lag",
        type=non_negative_float,
        metavar="SECONDS",
        help="exit 1 when the oldest due message has waited longer than this",
    )
    p.add_argument(
        "--watch",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS until interrupted (one JSON object per refresh with --json)",
    )
    p.set_defaults(handler=cmd_status, name="status")


def cmd_bench(args: argparse.Namespace) -> int:
    from dispatchers.bench.runner import main as run_bench

    return run_bench(args)


def add_bench_parser(sub: Any) -> None:
    from dispatchers.bench import add_arguments

    p = sub.add_parser(
        "bench",
        help="measure throughput and latency on this machine (throwaway database)",
        description="Run benchmark scenarios, each in a fresh schema dropped afterwards, "
        "against a throwaway embedded PostgreSQL (or --database-url), with a fast "
        "receiver on 127.0.0.1 in its own process. Prints one table (or --json). Exit "
        "status 1 only if a message was lost or delivered twice; missed targets are "
        "reported, not failed.",
    )
    add_arguments(p)
    p.set_defaults(handler=cmd_bench, name="bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox",
        description="Transactional outbox for PostgreSQL: migrate the schema, run "
        "dispatchers, inspect and operate the queue.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("migrate", help="create or upgrade the outbox schema (idempotent)")
    add_database_options(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_migrate)

    add_dispatch_parser(sub)
    add_operator_parsers(sub)
    add_bench_parser(sub)

    p = sub.add_parser(
        "demo",
        help="run the whole contract end to end on this machine (embedded database)",
        description="Publish order events from business transactions (some rolled back), "
        "deliver them as signed webhooks to a local receiver that fails some requests "
        "once after applying them, and check every invariant. Uses the schemas "
        "outbox_demo and outbox_demo_inbox (dropped and recreated). Exit 0 only if "
        "every invariant held.",
    )
    p.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL, $DATABASE_URL, "
        "else the embedded server in ./.outbox/pg)",
    )
    p.add_argument("--events", type=positive_int, default=1000, help="events (default: 1000)")
    p.add_argument(
        "--rate",
        type=positive_float,
        default=150.0,
        help="business transactions per second (default: 150)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed, for a repeatable run")
    p.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # for commands that start copies of themselves
    handler: Handler = args.handler
    name = getattr(args, "name", args.command)
    try:
        return handler(args)
    except OutboxError as exc:
        print(f"outbox {name}: {exc}", file=sys.stderr)
        return 2
    except psycopg.Error as exc:
        hint = ""
        if exc.sqlstate in ("42P01", "3F000"):  # undefined table, invalid schema name
            hint = f"\n(is the schema migrated? run: outbox migrate --schema {args.schema})"
        print(f"outbox {name}: database error: {exc}{hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
