"""``outbox retention``: set, list, delete the retention rules that keep the
payloads of an endpoint's, or an event type's, delivered messages for less
than the history (see :mod:`outbox.retention_rules`)."""

from __future__ import annotations

import argparse

from dispatchers.cli._common import (
    Commands,
    Handler,
    add_database_options,
    integer,
    parse_duration,
    transaction,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit, table
from dispatchers.ui.policy_text import format_duration
from outbox.internal import MAX_ID
from outbox.retention_rules import RetentionRules


def _subject(endpoint_id: int | None, event_type: str | None) -> str:
    return f"endpoint {endpoint_id}" if endpoint_id is not None else f"event type {event_type}"


def cmd_retention_set(args: argparse.Namespace) -> ExitCode:
    with transaction(args) as conn:
        rule = RetentionRules(schema=args.schema).set(
            conn,
            payload_retention=args.payload,
            endpoint_id=args.endpoint,
            event_type=args.event_type,
        )
    emit(
        args,
        rule.as_dict(),
        f"{_subject(rule.endpoint_id, rule.event_type)}: delivered messages keep their payloads "
        f"{format_duration(rule.payload_retention_s)}, then the dispatchers erase them",
    )
    return ExitCode.OK


def cmd_retention_list(args: argparse.Namespace) -> ExitCode:
    with transaction(args) as conn:
        rules = RetentionRules(schema=args.schema).all(conn)
    rows = [
        (
            _subject(r.endpoint_id, r.event_type),
            format_duration(r.payload_retention_s),
            r.erased_until,
            r.updated_at,
        )
        for r in rules
    ]
    text = (
        table(["RULE OF", "PAYLOADS KEPT", "ERASED UNTIL", "UPDATED"], rows)
        if rows
        else "no retention rules: payloads are kept as long as the history"
    )
    emit(args, [r.as_dict() for r in rules], text)
    return ExitCode.OK


def cmd_retention_delete(args: argparse.Namespace) -> ExitCode:
    with transaction(args) as conn:
        RetentionRules(schema=args.schema).delete(
            conn, endpoint_id=args.endpoint, event_type=args.event_type
        )
    emit(
        args,
        {"endpoint_id": args.endpoint, "event_type": args.event_type, "deleted": True},
        f"deleted the retention rule of {_subject(args.endpoint, args.event_type)}; its "
        "payloads are kept as long as the history (what was erased stays erased)",
    )
    return ExitCode.OK


def _add_subject(p: argparse.ArgumentParser) -> None:
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--endpoint", type=integer(1, MAX_ID), metavar="ID", help="the rule of this endpoint"
    )
    which.add_argument(
        "--event-type", metavar="TYPE", help="the rule of this event type, e.g. order.created"
    )


def add_parser(commands: Commands) -> None:
    group = commands.add_parser(
        "retention",
        help="keep an endpoint's or event type's payloads for less than the history",
        description="Retention rules: the delivered messages of an endpoint, or of an "
        "event type, keep their bodies, headers and receivers' answers for the rule's "
        "period; then every dispatcher's retention replaces them with the marker of "
        "outbox expunge, recorded, and the delivery record stays for --retention. "
        "When an endpoint's rule and its event type's both apply, the shorter does.",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        add_database_options(p)
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(handler=handler, name=f"retention {name}")
        return p

    p = action("set", cmd_retention_set, "set the payload retention of an endpoint or event type")
    _add_subject(p)
    p.add_argument(
        "--payload",
        type=parse_duration,
        required=True,
        metavar="SPAN",
        help="how long after delivery the payloads are kept, e.g. 1d (1m at least)",
    )

    action("list", cmd_retention_list, "list the retention rules")

    p = action(
        "delete", cmd_retention_delete, "drop the retention rule of an endpoint or event type"
    )
    _add_subject(p)
