"""``outbox destinations``: set, list, show, delete the policies of plain
destinations (a cap on requests in flight, a rate limit), which every
dispatcher process enforces (see :mod:`outbox.destinations`).

ORIGIN is a URL: its origin (``scheme://host:port``) names the destination, and
a path, query or fragment is dropped, so a URL copied from a message works.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dispatchers.cli._common import (
    Commands,
    Handler,
    UsageError,
    add_database_options,
    integer,
    number,
    positive_int,
    transaction,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit, fields, table
from dispatchers.ui.policy_text import rate_text
from outbox.destinations import Destinations
from outbox.internal import MAX_BURST, MAX_RATE_LIMIT, MIN_RATE_LIMIT

if TYPE_CHECKING:
    from outbox.destinations import DestinationPolicy

per_second = number(MIN_RATE_LIMIT, MAX_RATE_LIMIT)
"""An argument type: requests per second, as :mod:`outbox._policy_fields` bounds them."""

burst_size = integer(1, MAX_BURST)
"""An argument type: a rate limit's burst."""


def _policy_fields(policy: DestinationPolicy) -> str:
    return fields(
        [
            ("destination", policy.destination),
            ("max concurrency", policy.max_concurrency),
            ("rate limit", rate_text(policy.rate_limit_per_s, policy.burst)),
            ("created", policy.created_at),
            ("updated", policy.updated_at),
        ]
    )


def policies_table(rows: Sequence[dict[str, Any]]) -> str:
    """The destinations with a policy, one line each, as ``outbox status`` shows
    them (the rows of :func:`outbox.admin.status`'s ``destinations``)."""
    return table(
        ["DESTINATION", "MAX CONCURRENCY", "RATE LIMIT", "READY", "RUNNING"],
        [
            (
                d["destination"],
                d["max_concurrency"],
                rate_text(d["rate_limit_per_s"], d["burst"]),
                d["ready"],
                d["running"],
            )
            for d in rows
        ],
    )


def cmd_destinations_set(args: argparse.Namespace) -> ExitCode:
    if args.burst is not None and args.rate_limit is None:
        raise UsageError("--burst: needs --rate-limit")
    if args.rate_limit is None and args.max_concurrency is None:
        raise UsageError("give --rate-limit, --max-concurrency or both")
    destinations = Destinations(schema=args.schema)
    with transaction(args) as conn:
        policy = destinations.set(
            conn,
            args.origin,
            rate_limit=args.rate_limit,
            burst=args.burst,
            max_concurrency=args.max_concurrency,
        )
    emit(
        args, policy.as_dict(), f"set the policy of {policy.destination}\n{_policy_fields(policy)}"
    )
    return ExitCode.OK


def cmd_destinations_list(args: argparse.Namespace) -> ExitCode:
    destinations = Destinations(schema=args.schema)
    with transaction(args) as conn:
        listed = destinations.all(conn)
    text = (
        table(
            ["DESTINATION", "MAX CONCURRENCY", "RATE LIMIT", "UPDATED"],
            [
                (
                    p.destination,
                    p.max_concurrency,
                    rate_text(p.rate_limit_per_s, p.burst),
                    p.updated_at,
                )
                for p in listed
            ],
        )
        if listed
        else "no destination policies"
    )
    emit(args, [p.as_dict() for p in listed], text)
    return ExitCode.OK


def cmd_destinations_show(args: argparse.Namespace) -> ExitCode:
    destinations = Destinations(schema=args.schema)
    with transaction(args) as conn:
        policy = destinations.require(conn, args.origin)
    emit(args, policy.as_dict(), _policy_fields(policy))
    return ExitCode.OK


def cmd_destinations_delete(args: argparse.Namespace) -> ExitCode:
    destinations = Destinations(schema=args.schema)
    with transaction(args) as conn:
        origin = destinations.delete(conn, args.origin)
    emit(
        args,
        {"destination": origin, "deleted": True},
        f"deleted the policy of {origin}; its messages go unbounded from the next claim",
    )
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    group = commands.add_parser(
        "destinations",
        help="rate limits and concurrency caps of plain destinations",
        description="Policies of plain destinations (the origin, scheme://host:port, of "
        "messages' URLs): a cap on requests in flight and a rate limit, enforced across "
        "every dispatcher. A webhook endpoint's are set with `outbox endpoints`.",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        add_database_options(p)
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(handler=handler, name=f"destinations {name}")
        return p

    def origin(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "origin",
            metavar="ORIGIN",
            help="an http(s) URL; its origin (scheme://host:port) names the destination",
        )

    p = action(
        "set",
        cmd_destinations_set,
        "set (replace) a destination's policy: a rate limit, a cap, or both",
    )
    origin(p)
    rate_options(p)
    p.add_argument(
        "--max-concurrency",
        type=positive_int,
        metavar="N",
        help="most requests in flight to it at once, across all dispatchers",
    )

    action("list", cmd_destinations_list, "list the destination policies")

    p = action("show", cmd_destinations_show, "show one destination's policy")
    origin(p)

    p = action("delete", cmd_destinations_delete, "remove a destination's policy")
    origin(p)


def rate_options(p: argparse.ArgumentParser) -> None:
    """``--rate-limit`` and ``--burst``, of ``destinations set`` and ``endpoints
    add/update``."""
    p.add_argument(
        "--rate-limit",
        type=per_second,
        metavar="N",
        help="most requests per second, across all dispatchers",
    )
    p.add_argument(
        "--burst",
        type=burst_size,
        metavar="N",
        help="requests that may start at once after a quiet spell (default: about a "
        "second's worth of the rate limit, from 1 to 10)",
    )
