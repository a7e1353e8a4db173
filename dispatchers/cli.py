"""The ``outbox`` command line.

Environment variables are read here and nowhere else. The database is the one
given by ``--database-url``, else ``OUTBOX_DATABASE_URL``, else ``DATABASE_URL``,
else an embedded PostgreSQL kept in ``./.outbox/pg`` (``OUTBOX_EMBEDDED_DIR``
moves it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from outbox.dsn import libpq_url, redact
from outbox.errors import OutboxError

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


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON with ``--json``, else the human-readable ``text``."""
    if getattr(args, "json", False):
        print(json.dumps(data, default=str, indent=2))
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
    from dispatchers.log import EventLog
    from dispatchers.pool import run_dispatcher

    config = DispatcherConfig(
        schema=args.schema,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        lease=args.lease,
        request_timeout=args.request_timeout,
        connect_timeout=min(args.connect_timeout, args.request_timeout),
        grace=args.grace,
        poll_interval=args.poll_interval,
        listen=args.listen,
        allow_private_networks=args.allow_private_networks,
        allow_networks=tuple(args.allow_network),
        idempotency_key_format=args.idempotency_key_format,
        prepare=args.prepared_statements,
    )
    log = EventLog(format=args.log_format, level=args.log_level)
    db = resolve_database(args)
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
        "--concurrency",
        type=positive_int,
        default=64,
        help="deliveries in flight at once (default: 64)",
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
        help="never prepare statements (for poolers that cannot keep them)",
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
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except OutboxError as exc:
        print(f"outbox {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
