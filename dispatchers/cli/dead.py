"""``outbox dead``: list, retry or purge dead messages.

Retry and purge select by message IDs, by filters (all given must match) or
``--all``, never by default: an empty selection is a usage error, not "every one".
They act on the IDs that name dead messages and name the others on stderr, with
exit status 1; an ID that cannot be a message's (past ``bigint``) is refused with
exit status 2 before anything runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dispatchers.cli._common import (
    Commands,
    UsageError,
    add_database_options,
    confirm,
    database_id,
    parse_time,
    positive_int,
    transaction,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import cell, emit, table
from outbox.defaults import DEFAULT_MAX_ATTEMPTS, DEFAULT_WEBHOOK_MAX_ATTEMPTS


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


def cmd_dead_list(args: argparse.Namespace) -> ExitCode:
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
    return ExitCode.OK


def _missing(args: argparse.Namespace, ids: list[int]) -> ExitCode:
    """Name the IDs that named no dead message, if any; the exit status."""
    if not ids:
        return ExitCode.OK
    print(
        f"outbox {args.name}: no dead message with id {', '.join(map(str, ids))}",
        file=sys.stderr,
    )
    return ExitCode.FAILURE


def cmd_dead_retry(args: argparse.Namespace) -> ExitCode:
    from outbox.admin import dead_missing, dead_retry

    selection = _dead_selection(args)
    with transaction(args) as conn:
        missing = dead_missing(conn, args.ids, schema=args.schema)
        count = dead_retry(conn, schema=args.schema, budget=args.attempts, **selection)
    emit(
        args,
        {"retried": count},
        f"retried {count} dead message(s): they are ready now (paused if their endpoint "
        "is disabled), with the same idempotency keys",
    )
    return _missing(args, missing)


def cmd_dead_purge(args: argparse.Namespace) -> ExitCode:
    from outbox.admin import dead_count, dead_missing, dead_purge

    selection = _dead_selection(args)

    def question() -> str:
        with transaction(args) as conn:
            count = dead_count(conn, schema=args.schema, **selection)
        return f"Delete {count} dead message(s) and their attempt history for good?"

    if not confirm(args, "purge dead messages", question):
        return ExitCode.FAILURE
    with transaction(args) as conn:
        missing = dead_missing(conn, args.ids, schema=args.schema)
        count = dead_purge(conn, schema=args.schema, **selection)
    emit(args, {"purged": count}, f"purged {count} dead message(s)")
    return _missing(args, missing)


def add_parser(commands: Commands) -> None:
    group = commands.add_parser(
        "dead",
        help="list, retry or purge dead messages",
        description="Dead messages: those that failed permanently or spent their attempts.",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def filters(p: argparse.ArgumentParser) -> None:
        p.add_argument("--endpoint", type=database_id, metavar="ID", help="of this endpoint")
        p.add_argument("--event-type", metavar="TYPE", help="of this event type")
        p.add_argument(
            "--since",
            type=parse_time,
            metavar="TIME",
            help="that died at or after TIME (ISO 8601 with offset or Z, or 30m, 2h, 7d ago)",
        )

    p = actions.add_parser(
        "list",
        help="list dead messages, newest first",
        description="List dead messages, newest first: when each died, its attempts, the "
        "last status and error, its endpoint and event type. Filters given must all match.",
    )
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
        p.add_argument("ids", nargs="*", type=database_id, metavar="ID", help="message ids")
        filters(p)
        p.add_argument("--all", action="store_true", help="every dead message")
        p.add_argument("--json", action="store_true", help="print the count as JSON")
        if name == "retry":
            p.add_argument(
                "--attempts",
                type=positive_int,
                metavar="N",
                help="attempts each message gets now (default: "
                f"{DEFAULT_WEBHOOK_MAX_ATTEMPTS} for webhooks, {DEFAULT_MAX_ATTEMPTS} otherwise)",
            )
        else:
            p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        p.set_defaults(handler=handler, name=f"dead {name}")
