"""``outbox portal-link``: a signed, expiring link to a tenant's consumer portal.

The link opens pages, served by ``outbox ui``, where the users of one tenant
add and edit that tenant's endpoints, see its deliveries and their attempts,
replay a message, send a test event and reveal or rotate a signing secret, and
see nothing of any other tenant (:mod:`outbox.portal` makes it). The command
prints the URL alone on stdout, so that ``$(outbox portal-link ...)`` is the
URL; the token in it is stored only as a digest and shown nowhere else.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from urllib.parse import urlsplit

from dispatchers.cli._common import (
    Commands,
    UsageError,
    add_database_options,
    naming_options,
    parse_duration,
    transaction,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli.ui import DEFAULT_HOST, DEFAULT_PORT
from outbox.portal import DEFAULT_EXPIRY, MAX_EXPIRY, MIN_EXPIRY, create_link

DEFAULT_BASE_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
"""Where ``outbox ui`` listens by default."""

OPTIONS = {"tenant": "--tenant", "expires": "--expires"}
"""The option that gives each argument of :func:`outbox.portal.create_link`."""


def base_url(text: str) -> str:
    """``--base-url``: the dashboard's address as its visitors reach it, an
    absolute http(s) URL without query or fragment; its trailing slash dropped."""
    parts = urlsplit(text.strip())
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
        or parts.username is not None
        or any(c.isspace() or not c.isprintable() for c in text.strip())
    ):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not an http(s) address without query, fragment or "
            "credentials (such as https://webhooks.example.com)"
        )
    return text.strip().rstrip("/")


def _expiry(text: str) -> timedelta:
    return timedelta(seconds=parse_duration(text))


def cmd_portal_link(args: argparse.Namespace) -> ExitCode:
    if not MIN_EXPIRY <= args.expires <= MAX_EXPIRY:
        raise UsageError("--expires: must be from 1m to 30d")
    with naming_options(OPTIONS), transaction(args) as conn:
        link = create_link(conn, tenant=args.tenant, expires=args.expires, schema=args.schema)
    print(args.base_url + link.url_path, flush=True)
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    hours = DEFAULT_EXPIRY / timedelta(hours=1)
    p = commands.add_parser(
        "portal-link",
        help="print a signed, expiring link to a tenant's consumer portal",
        description="Make a link to the consumer portal of one tenant and print it alone "
        "on stdout: pages served by outbox ui where that tenant's users add and edit its "
        "endpoints, choose their event types, see its deliveries and attempts, replay a "
        "message, send a test event, and reveal or rotate a signing secret; nothing of "
        "any other tenant. Whoever holds the link can do all of that until it expires.",
    )
    add_database_options(p)
    p.add_argument(
        "--tenant", metavar="ID", required=True, help="the tenant's id (outbox tenants add ID)"
    )
    p.add_argument(
        "--expires",
        type=_expiry,
        default=DEFAULT_EXPIRY,
        metavar="SPAN",
        help=f"how long the link works, from 1m to 30d (default: {hours:g}h)",
    )
    p.add_argument(
        "--base-url",
        type=base_url,
        default=DEFAULT_BASE_URL,
        metavar="URL",
        help=f"the address of outbox ui as the tenant's users reach it (default: "
        f"{DEFAULT_BASE_URL})",
    )
    p.set_defaults(handler=cmd_portal_link, name="portal-link")
