"""``outbox ui``: serve the operator dashboard for one database and schema.

Safe by default: it binds 127.0.0.1, and any other address needs a login token or
the command refuses to start (``--api-only`` excepted: every API request carries
a bearer token). ``--read-only`` serves no action at all. ``--host`` is checked
before anything starts; without a token every address it resolves to must be
loopback.

Design: docs/explanation/design/cli.md
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import socket
import sys

from dispatchers import environment
from dispatchers.cli._common import (
    Commands,
    UsageError,
    add_database_options,
    add_secrets_key_option,
    keyring,
    port,
    read_small_file,
    require_extra,
    resolve_database,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.ui.limits import (
    BODY_TIMEOUT,
    CONNECTION_WAIT,
    ENDPOINTS_PAGE,
    HEADER_TIMEOUT,
    MAX_CONNECTIONS,
    SIGN_IN_ATTEMPTS,
    TABLE_ROWS,
)
from outbox.errors import SchemaNotMigrated
from outbox.sealing import Keyring

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8321

MAX_TOKEN_FILE = 4096
"""The most a ``--token-file`` may hold."""


def _token(args: argparse.Namespace) -> str | None:
    """The login token: the file's first line, else ``$OUTBOX_UI_TOKEN``, else none."""
    if args.token_file is None:
        return environment.ui_token()
    text = read_small_file(args.token_file, "--token-file", limit=MAX_TOKEN_FILE)
    token = text.split("\n", 1)[0].strip()
    if not token:
        raise UsageError(f"--token-file: {args.token_file} holds no token")
    if not token.isprintable():
        raise UsageError(f"--token-file: the first line of {args.token_file} is not printable")
    return token


def _host(given: str, *, port: int, token: bool) -> str:
    """The address to listen on, as ``--host`` gives it: an IPv6 address without
    its brackets, a name without the root's dot. Refused (naming ``--host``) if
    it holds spaces or does not resolve; without a token, unless every address
    it resolves to is loopback."""
    host = given
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.endswith(".") and not host.endswith(".."):
        host = host[:-1]
    if not host or not host.isprintable() or any(c.isspace() for c in host):
        raise UsageError(f"--host: {given!r} is not an address or a host name")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a host name"
        raise UsageError(f"--host: cannot listen on {given!r}: {reason}") from None
    addresses = {str(info[4][0]) for info in found}
    if not token and not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise UsageError(
            f"--host: refusing to serve {given} without a token: give --token-file "
            "or set OUTBOX_UI_TOKEN (or bind 127.0.0.1)"
        )
    return host


def _label(url: str) -> str:
    """The database as the dashboard's header names it: name and host only."""
    from psycopg.conninfo import conninfo_to_dict

    info = conninfo_to_dict(url)
    host = str(info.get("host") or "local socket")
    return f"{info.get('dbname') or info.get('user') or 'postgres'} on {host}"


def serve_dashboard(
    url: str,
    *,
    schema: str,
    host: str,
    port: int,
    read_only: bool,
    token: str | None,
    keys: Keyring | None = None,
    frame_ancestors: tuple[str, ...] = ("'none'",),
    pages: bool = True,
) -> None:
    """Serve the dashboard of ``schema`` in the database at ``url`` until
    interrupted, saying on stderr where; ``keys`` open sealed signing secrets.
    The management API is served under /api/v1, and the consumer portal under
    /portal/, framed only by the sites of ``frame_ancestors``; without
    ``pages``, the management API alone."""
    from dispatchers.portal.app import MOUNT, build_portal
    from dispatchers.runtime.log import EventLog
    from dispatchers.ui.app import CannotListen, serve
    from dispatchers.ui.auth import Guard
    from dispatchers.ui.dashboard import Dashboard, templates
    from dispatchers.ui.store import DashboardStore

    dashboard = Dashboard(
        store=DashboardStore(url, schema=schema),
        guard=Guard(token=token),
        log=EventLog(),
        templates=templates(),
        read_only=read_only,
        database=_label(url),
        keyring=keys,
        pages=pages,
    )

    def started(address: str) -> None:
        print(f"outbox ui: serving {address}", file=sys.stderr, flush=True)

    try:
        portal = {MOUNT: build_portal(dashboard, ancestors=frame_ancestors)} if pages else {}
        asyncio.run(serve(dashboard, host=host, port=port, started=started, mounts=portal))
    except CannotListen as exc:
        raise UsageError(f"--host/--port: {exc}") from None


def _require_migrated(url: str, schema: str) -> None:
    """:class:`SchemaNotMigrated` (one line, exit 1) unless every migration of this
    version is applied to ``schema``: checked before serving, or every page would
    answer 500. The operator's role reads the migrations' record (outbox roles)."""
    from outbox.migrations import applied_versions, load_migrations

    applied = set(applied_versions(url, schema=schema))
    if not {m.version for m in load_migrations()} <= applied:
        raise SchemaNotMigrated(schema, behind=bool(applied))


def cmd_ui(args: argparse.Namespace) -> ExitCode:
    require_extra("ui")
    import psycopg

    from dispatchers.ui.auth import is_loopback

    if args.api_only and args.token_file is not None:
        raise UsageError(
            "--token-file: signs in to the pages, which --api-only does not serve "
            "(the API takes tokens of outbox api-tokens)"
        )
    token = None if args.api_only else _token(args)
    ancestors = _frame_ancestors(args.portal_frame_ancestors)
    guarded = token is not None or args.api_only
    if not guarded and not is_loopback(args.host):
        print(
            f"outbox ui: refusing to serve {args.host} without a token: give --token-file "
            "or set OUTBOX_UI_TOKEN (or bind 127.0.0.1)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    host = _host(args.host, port=args.port, token=guarded)
    keys = keyring(args)
    db = resolve_database(args)
    try:
        _require_migrated(db.url, args.schema)
    except psycopg.errors.InsufficientPrivilege:
        print(
            f"outbox ui: this role may not use schema {args.schema!r}: grant it the "
            "operator's privileges (outbox roles --operator ROLE --apply)",
            file=sys.stderr,
        )
        return ExitCode.FAILURE
    serve_dashboard(
        db.url,
        schema=args.schema,
        host=host,
        port=args.port,
        read_only=args.read_only,
        token=token,
        keys=keys,
        frame_ancestors=ancestors,
        pages=not args.api_only,
    )
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "ui",
        help="serve the operator dashboard (web pages for the backlog, messages, dead letters, "
        "endpoints) and the management API",
        description="Serve the operator dashboard for one database and schema: the "
        "backlog, attempts per minute, dispatchers and endpoints at a glance; find a "
        "message and see every attempt; retry or purge dead letters; disable or enable "
        "endpoints. It binds "
        f"{DEFAULT_HOST} by default; another address needs a token. It holds at most "
        f"{MAX_CONNECTIONS} connections at once (past that, a 503), gives each "
        f"{HEADER_TIMEOUT:g} s to send a request's headers and {BODY_TIMEOUT:g} s to send "
        f"its form, waits at most {CONNECTION_WAIT:g} s for the database (past that, a "
        f"503), and allows {SIGN_IN_ATTEMPTS} sign-in attempts a minute per address. Lists are "
        f"paged: {ENDPOINTS_PAGE} endpoints a page; the overview shows the first "
        f"{TABLE_ROWS} of each table and links to the rest. The management API (JSON, "
        "bearer tokens of outbox api-tokens) is served under /api/v1, its OpenAPI "
        "document at /api/v1/openapi.json.",
    )
    add_database_options(p)
    add_secrets_key_option(p)
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
        "edits) is offered or accepted, and the API's GET routes alone",
    )
    p.add_argument(
        "--api-only",
        action="store_true",
        help="serve the management API alone, no pages; every request needs a bearer token "
        "(outbox api-tokens create), so any address may be bound without --token-file",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="sign-in token, the file's first line (default: $OUTBOX_UI_TOKEN; without "
        "one, only loopback is served and nobody signs in)",
    )
    p.add_argument(
        "--portal-frame-ancestors",
        metavar="SOURCE",
        nargs="+",
        type=_frame_source,
        default=("'none'",),
        help="the sites that may show the consumer portal in a frame: origins such as "
        "https://app.example.com (a scheme, a host, an optional port), 'self', or 'none' "
        "(the default: no site)",
    )
    p.set_defaults(handler=cmd_ui, name="ui")


def _frame_ancestors(sources: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The sources of ``--portal-frame-ancestors`` together: 'none' stands alone."""
    from dispatchers.portal.guard import frame_ancestors

    try:
        return frame_ancestors(sources)
    except ValueError as exc:
        raise UsageError(f"--portal-frame-ancestors: {exc}") from None


def _frame_source(text: str) -> str:
    """One source of ``--portal-frame-ancestors``, checked on its own."""
    from dispatchers.portal.guard import frame_ancestors

    try:
        (source,) = frame_ancestors([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return source
