"""The ``outbox`` command line.

One module per command group, each adding its command with ``add_parser``:
:mod:`~dispatchers.cli.migrate`, :mod:`~dispatchers.cli.dispatch`,
:mod:`~dispatchers.cli.endpoints`, :mod:`~dispatchers.cli.dead`,
:mod:`~dispatchers.cli.inspect` (status, messages, replay), :mod:`~dispatchers.cli.roles`,
:mod:`~dispatchers.cli.bench` and :mod:`~dispatchers.cli.demo`; what they share is
in :mod:`~dispatchers.cli._common` (database, argument types) and
:mod:`~dispatchers.cli._render` (tables, JSON). Building the parser imports none of
the runtime's heavy modules (HTTP clients, the dispatcher, the bench): each
command imports what it runs when it runs.

Operator commands (``endpoints``, ``dead``, ``replay``, ``messages``,
``status``) each do their work in one transaction and commit it. Bad input
exits 2 with a message naming the field, having written nothing; so does a
command whose extra is not installed; a database error exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import psycopg

from dispatchers.cli import bench, dead, demo, dispatch, endpoints, inspect, migrate, roles
from dispatchers.cli._common import Handler, MissingExtra
from outbox.errors import OutboxError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox",
        description="Transactional outbox for PostgreSQL: migrate the schema, run "
        "dispatchers, inspect and operate the queue.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (migrate, roles, dispatch, endpoints, dead, inspect, bench, demo):
        group.add_parser(commands)
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
    except MissingExtra as exc:
        print(f"outbox: {name} {exc}", file=sys.stderr)
        return 2
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
