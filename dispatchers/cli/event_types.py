"""``outbox event-types``: set, list, delete an event type's retry schedule.

The webhooks of an event type follow its schedule when their endpoint has none
of its own; without either, the dispatcher's default schedule applies.
"""

from __future__ import annotations

import argparse

from dispatchers.cli._common import (
    Commands,
    Handler,
    add_database_options,
    retry_schedule,
    transaction,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit, table
from dispatchers.ui.policy_text import format_schedule
from outbox.event_types import EventTypes


def cmd_event_types_set(args: argparse.Namespace) -> ExitCode:
    with transaction(args) as conn:
        stored = EventTypes(schema=args.schema).set(
            conn, args.event_type, retry_schedule=args.retry_schedule
        )
    emit(
        args,
        stored.as_dict(),
        f"event type {stored.event_type}: retry schedule {format_schedule(stored.retry_schedule)}",
    )
    return ExitCode.OK


def cmd_event_types_list(args: argparse.Namespace) -> ExitCode:
    with transaction(args) as conn:
        listed = EventTypes(schema=args.schema).all(conn)
    rows = [(t.event_type, format_schedule(t.retry_schedule), t.updated_at) for t in listed]
    text = table(["EVENT TYPE", "RETRY SCHEDULE", "UPDATED"], rows) if rows else "no event types"
    emit(args, [t.as_dict() for t in listed], text)
    return ExitCode.OK


def cmd_event_types_delete(args: argparse.Namespace) -> ExitCode:
    with transaction(args) as conn:
        EventTypes(schema=args.schema).delete(conn, args.event_type)
    emit(
        args,
        {"event_type": args.event_type, "deleted": True},
        f"deleted the settings of event type {args.event_type}; its webhooks follow "
        "the default retry schedule",
    )
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    group = commands.add_parser(
        "event-types",
        help="set the retry schedule of an event type's webhooks",
        description="Event types' settings: the retry schedule of the webhooks of an "
        "event type whose endpoint has none of its own.",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        add_database_options(p)
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(handler=handler, name=f"event-types {name}")
        return p

    p = action("set", cmd_event_types_set, "set an event type's retry schedule")
    p.add_argument("event_type", metavar="TYPE", help="the event type, e.g. order.created")
    p.add_argument(
        "--retry-schedule",
        type=retry_schedule,
        required=True,
        metavar="DELAYS",
        help="delays before each retry, e.g. 5s,1m,10m,1h (the last repeats until "
        "the attempts are spent); applies from the next retry scheduled: a message "
        "already waiting keeps its due time",
    )

    action("list", cmd_event_types_list, "list the event types with settings")

    p = action("delete", cmd_event_types_delete, "drop an event type's settings")
    p.add_argument("event_type", metavar="TYPE", help="the event type")
