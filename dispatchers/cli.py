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
