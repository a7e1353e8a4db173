"""``outbox migrate``: create or upgrade the outbox schema (idempotent)."""

from __future__ import annotations

import argparse

from dispatchers.cli._common import Commands, add_database_options, resolve_database
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit
from outbox.dsn import redact


def cmd_migrate(args: argparse.Namespace) -> ExitCode:
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
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "migrate",
        help="create or upgrade the outbox schema (idempotent)",
        description="Create the outbox schema (tables, indexes) or apply the "
        "migrations it lacks, in order, each checksummed, under a lock so that concurrent "
        "runs wait for each other. Run it as the schema's owner, once before the first "
        "enqueue and after each upgrade; a schema that is up to date is left as it is.",
    )
    add_database_options(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_migrate)
