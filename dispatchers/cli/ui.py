"""``outbox ui``: serve the operator dashboard for one database and schema.

Safe by default: it binds 127.0.0.1, and any other address needs a login token
(``--token-file``, else ``$OUTBOX_UI_TOKEN``) or the command refuses to start.
``--read-only`` serves the pages and no action at all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from dispatchers.cli._common import (
    Commands,
    UsageError,
    add_database_options,
    port,
    require_extra,
    resolve_database,
)
from dispatchers.cli._exit import ExitCode

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8321


def _token(args: argparse.Namespace) -> str | None:
    """The login token: the file's first line, else ``$OUTBOX_UI_TOKEN``, else none."""
    if args.token_file is None:
        return os.environ.get("OUTBOX_UI_TOKEN") or None
    try:
        with open(args.token_file, encoding="utf-8") as file:
            token = file.readline().strip()
    except OSError as exc:
        raise UsageError(f"--token-file: cannot read {args.token_file}: {exc.strerror}") from None
    if not token:
        raise UsageError(f"--token-file: {args.token_file} holds no token")
    return token


def _label(url: str) -> str:
    """The database as the dashboard's header names it: name and host only."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(url)
    host = str(info.get("host") or "local socket")
    return f"{info.get('dbname') or info.get('user') or 'postgres'} on {host}"


def serve_dashboard(
    url: str, *, schema: str, host: str, port: int, read_only: bool, token: str | None
) -> None:
    """Serve the dashboard of ``schema`` in the database at ``url`` until
    interrupted, saying on stderr where."""
    from dispatchers.log import EventLog
    from dispatchers.ui.app import serve
    from dispatchers.ui.auth import Guard
    from dispatchers.ui.dashboard import Dashboard, templates
    from dispatchers.ui.store import Store

    dashboard = Dashboard(
        store=Store(url, schema=schema),
        guard=Guard(token=token),
        log=EventLog(),
        templates=templates(),
        read_only=read_only,
        database=_label(url),
    )

    def started(address: str) -> None:
        print(f"outbox ui: serving {address}", file=sys.stderr, flush=True)

    asyncio.run(serve(dashboard, host=host, port=port, started=started))


def cmd_ui(args: argparse.Namespace) -> ExitCode:
    require_extra("ui")
    from dispatchers.ui.auth import is_loopback

    token = _token(args)
    if token is None and not is_loopback(args.host):
        print(
            f"outbox ui: refusing to serve {args.host} without a token: give --token-file "
            "or set OUTBOX_UI_TOKEN (or bind 127.0.0.1)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    db = resolve_database(args)
    serve_dashboard(
        db.url,
        schema=args.schema,
        host=args.host,
        port=args.port,
        read_only=args.read_only,
        token=token,
    )
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "ui",
        help="serve the operator dashboard (web pages for the backlog, messages, dead letters, "
        "endpoints)",
        description="Serve the operator dashboard for one database and schema: the "
        "backlog, attempts per minute, dispatchers and endpoints at a glance; find a "
        "message and see every attempt; retry or purge dead letters; disable or enable "
        "endpoints. It binds "
        f"{DEFAULT_HOST} by default; another address needs a token.",
    )
    add_database_options(p)
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default: {DEFAULT_HOST}); any address but loopback "
        "needs a token",
    )
    p.add_argument(
        "--port",
        type=port,
        default=DEFAULT_PORT,
        help=f"port to listen on (default: {DEFAULT_PORT}; 0 picks a free one)",
    )
    p.add_argument(
        "--read-only",
        action="store_true",
        help="serve the pages only: no action (retry, purge, reveal, replay, an endpoint's "
        "edits) is offered or accepted",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="sign-in token, the file's first line (default: $OUTBOX_UI_TOKEN; without "
        "one, only loopback is served and nobody signs in)",
    )
    p.set_defaults(handler=cmd_ui, name="ui")
