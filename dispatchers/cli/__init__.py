"""The ``outbox`` command line.

One module per command group, each adding its command with ``add_parser``:
:mod:`~dispatchers.cli.migrate`, :mod:`~dispatchers.cli.dispatch`,
:mod:`~dispatchers.cli.tenants`, :mod:`~dispatchers.cli.endpoints`,
:mod:`~dispatchers.cli.destinations`,
:mod:`~dispatchers.cli.event_types`, :mod:`~dispatchers.cli.retention`,
:mod:`~dispatchers.cli.dead`,
:mod:`~dispatchers.cli.queue` (status, messages, replay), :mod:`~dispatchers.cli.roles`,
:mod:`~dispatchers.cli.db` (the embedded server), :mod:`~dispatchers.cli.ui` (the
dashboard and the management API), :mod:`~dispatchers.cli.api_tokens` (the
API's tokens), :mod:`~dispatchers.cli.portal` (links to the consumer portal),
:mod:`~dispatchers.cli.bench` and :mod:`~dispatchers.cli.demo`; what
they share is in :mod:`~dispatchers.cli._common` (database, argument types) and
:mod:`~dispatchers.cli._render` (tables, JSON). Building the parser imports none of
the runtime's heavy modules (HTTP clients, the dispatcher, the bench): each
command imports what it runs when it runs.

Operator commands (``tenants``, ``endpoints``, ``destinations``, ``event-types``,
``retention``, ``dead``, ``replay``, ``messages``, ``status``) each do their work in
one transaction and commit it. Bad input exits 2 with a message naming the field,
having written nothing; so does a command whose extra is not installed; a
database error exits 1 (the statuses are :class:`~dispatchers.cli._exit.ExitCode`).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from importlib import metadata

import psycopg

from dispatchers.cli import (
    api_tokens,
    bench,
    db,
    dead,
    demo,
    destinations,
    dispatch,
    endpoints,
    event_types,
    expunge,
    migrate,
    portal,
    queue,
    retention,
    roles,
    tenants,
    ui,
)
from dispatchers.cli._common import DISTRIBUTION, ArgumentParser, Handler, MissingExtra
from dispatchers.cli._exit import ExitCode
from outbox.errors import OutboxError, SchemaNotMigrated

__all__ = ["build_parser", "main"]


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="outbox",
        description="Transactional outbox for PostgreSQL: migrate the schema, run "
        "dispatchers, inspect and operate the queue.",
    )
    parser.add_argument("--version", action="version", version=f"outbox {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (
        migrate,
        roles,
        dispatch,
        tenants,
        endpoints,
        destinations,
        event_types,
        retention,
        dead,
        queue,
        expunge,
        db,
        ui,
        api_tokens,
        portal,
        bench,
        demo,
    ):
        group.add_parser(commands)
    return parser


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # for commands that start copies of themselves
    handler: Handler = args.handler
    name = getattr(args, "name", args.command)
    # SIGTERM ends a command as an exception would, so that what it holds is
    # released on the way out (the embedded server counts its users: a command
    # killed without cleaning up used to keep it running for good). Commands that
    # handle SIGTERM themselves (dispatch) install their own handlers over this.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return handler(args)
    except MissingExtra as exc:
        print(f"outbox: {name} {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except SchemaNotMigrated as exc:
        print(f"outbox {name}: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    except OutboxError as exc:
        print(f"outbox {name}: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except psycopg.Error as exc:
        if exc.sqlstate in ("42P01", "3F000") and hasattr(args, "schema"):
            # undefined table, invalid schema name: one line, not the statement
            print(f"outbox {name}: {SchemaNotMigrated(args.schema)}", file=sys.stderr)
        else:
            print(f"outbox {name}: database error: {exc}", file=sys.stderr)
        return ExitCode.FAILURE
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
