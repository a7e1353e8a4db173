"""``outbox status``, ``outbox messages show`` and ``outbox replay``: look at the
queue, at one message, and send delivered messages again.

Header values and bodies are hidden unless asked for: they may hold credentials
and personal data.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from typing import Any

from dispatchers.cli._common import (
    Commands,
    UsageError,
    add_database_options,
    add_secrets_key_option,
    database_id,
    keyring,
    parse_time,
    resolve_database,
    seconds,
    seconds_or_zero,
    transaction,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import UNPRINTABLE_TEXT, cell, emit, fields, table
from dispatchers.cli.destinations import policies_table
from outbox.errors import InvalidArgument
from outbox.sealing import Keyring


def cmd_replay(args: argparse.Namespace) -> ExitCode:
    from outbox.admin import replay, replay_event

    if args.event is not None:
        if args.since is not None or args.until is not None:
            raise UsageError("--event sends one event: it takes no --since or --until")
        with transaction(args) as conn:
            sent = replay_event(
                conn, schema=args.schema, event_key=args.event, endpoint_id=args.endpoint
            )
        emit(
            args,
            {"message_id": sent.id, "created": sent.created, "endpoint_id": args.endpoint},
            f"sent the event to endpoint {args.endpoint} as message {sent.id}"
            if sent.created
            else f"endpoint {args.endpoint} has the event already (message {sent.id}); "
            "nothing written",
        )
        return ExitCode.OK
    if args.since is None:
        raise UsageError("give --since (a window of delivered messages) or --event KEY")
    with transaction(args) as conn:
        count = replay(
            conn, schema=args.schema, endpoint_id=args.endpoint, since=args.since, until=args.until
        )
    emit(
        args,
        {"replayed": count, "endpoint_id": args.endpoint},
        f"replayed {count} delivered message(s) of endpoint {args.endpoint}: they go out "
        "again with the same webhook-id, so receivers that dedupe ignore them",
    )
    return ExitCode.OK


def cmd_messages_show(args: argparse.Namespace) -> ExitCode:
    from outbox.admin import message_show

    with transaction(args) as conn:
        message = message_show(conn, args.id, schema=args.schema)
    if message is None:
        raise InvalidArgument("id", f"no message with id {args.id} (never written, or purged)")
    data = message.as_dict(show_headers=args.show_headers, show_body=args.show_body)
    pairs: list[tuple[str, object]] = [
        ("id", message.id),
        ("state", message.state),
        ("idempotency key", message.idempotency_key),
        ("endpoint", message.endpoint_id),
        ("event type", message.event_type),
        ("request", f"{message.method} {message.url or '-'}"),
        ("content type", message.content_type),
        ("body", f"{len(message.body)} bytes"),
    ]
    for i, (name, value) in enumerate(data["headers"].items()):
        pairs.append(("headers" if i == 0 else "", f"{name}: {value}"))
    pairs += [
        ("ordering key", message.ordering_key),
        ("attempts", f"{message.attempts} of {message.max_attempts}"),
        ("available at", message.available_at),
        (
            "lease",
            f"{message.lease_owner} until {cell(message.lease_until)}"
            if message.lease_owner
            else None,
        ),
        ("last status", message.last_status),
        ("last error", message.last_error),
        ("created", message.created_at),
        ("completed", message.completed_at),
    ]
    text = fields(pairs)
    if message.attempt_log:
        text += "\n\n" + table(
            ["ATTEMPT", "STARTED", "MS", "STATUS", "OUTCOME", "ERROR", "OWNER"],
            [
                (
                    a.attempt,
                    a.started_at,
                    a.duration_ms,
                    a.status,
                    a.outcome,
                    cell(a.error, 50),
                    a.owner,
                )
                for a in message.attempt_log
            ],
        )
    replied = [a for a in message.attempt_log if a.response_excerpt]
    if replied:
        last = replied[-1]
        text += (
            f"\n\nlast reply (attempt {last.attempt}, status {cell(last.status)}, first "
            "bytes):\n" + UNPRINTABLE_TEXT.sub("?", last.response_excerpt or "")
        )
    if args.show_body:
        body = data.get("body")
        text += "\n\nbody:\n" + (
            UNPRINTABLE_TEXT.sub("?", body) if body is not None else "(binary) " + data["body_hex"]
        )
    emit(args, data, text)
    return ExitCode.OK


def cmd_status(args: argparse.Namespace) -> ExitCode:
    if args.watch is None:
        return _status_once(args)
    # resolved once (and the embedded server held), so each refresh neither starts
    # it again nor repeats its notice
    args.database_url = resolve_database(args).url
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() and not args.json else ""
    try:
        while True:
            if clear:
                sys.stdout.write(clear)
            _status_once(args)
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return ExitCode.OK


def _status_once(args: argparse.Namespace) -> ExitCode:
    from outbox.admin import status

    ring = keyring(args)
    with transaction(args) as conn:
        snapshot = status(conn, schema=args.schema)
    warnings = snapshot["warnings"] = _secrets_warnings(snapshot["secrets"], ring)
    if held := snapshot["messages"]["held_unsent"]:
        warnings.append(
            f"{held} message(s) held unsent by a dispatcher: a destination its SSRF guard "
            "refused (--allow-private-networks, --allow-network CIDR) or signing secrets "
            "it could not open; outbox messages show ID says which (last error)"
        )
    age: float | None = snapshot["oldest_ready_age_s"]
    lagging = args.max_lag is not None and age is not None and age > args.max_lag
    if args.max_lag is not None:
        snapshot["max_lag_s"] = args.max_lag
        snapshot["max_lag_exceeded"] = lagging
    counts = snapshot["messages"]
    recent = snapshot["last_5_minutes"]
    recent["delivered_per_s"] = round(recent["delivered"] / 300, 2)
    text = fields(
        [
            ("ready (due now)", counts["ready"]),
            ("blocked (breaker or hold)", counts["blocked"]),
            ("oldest ready waiting", None if age is None else f"{age:.1f} s"),
            ("scheduled (due later)", counts["scheduled"]),
            ("held unsent (see last error)", counts["held_unsent"]),
            ("running", counts["running"]),
            ("running, lease expired", counts["lease_expired"]),
            ("paused", counts["paused"]),
            ("dead", counts["dead"]),
            ("delivered, last 5 min", recent["delivered"]),
            ("failed, last 5 min", recent["failed"]),
            ("delivery rate, last 5 min", f"{recent['delivered_per_s']:g}/s"),
        ]
    )
    if snapshot["endpoints"]:
        text += "\n\n" + table(
            ["ENDPOINT", "URL", "ENABLED", "FAILURES", "PENDING", "DEAD", "LAST SUCCESS"],
            [
                (
                    e["id"],
                    cell(e["url"], 50),
                    e["enabled"],
                    e["failure_streak"],
                    e["pending"],
                    e["dead"],
                    e["last_success_at"],
                )
                for e in snapshot["endpoints"]
            ],
        )
    if snapshot["destinations"]:
        text += "\n\n" + policies_table(snapshot["destinations"])
    if snapshot["destination_health"]:
        text += "\n\n" + "\n".join(
            _health_line(d, snapshot["now"]) for d in snapshot["destination_health"]
        )
    emit(args, snapshot, text)
    for warning in warnings:
        print(f"outbox status: warning: {warning}", file=sys.stderr)
    if lagging:
        print(
            f"outbox status: the oldest ready message has waited {age:.1f} s, "
            f"more than --max-lag {args.max_lag:g} s",
            file=sys.stderr,
        )
        return ExitCode.FAILURE
    return ExitCode.OK


def _health_line(destination: dict[str, Any], now: datetime) -> str:
    """One line for a destination whose breaker is open or that a hold blocks."""
    name = cell(destination["destination"])
    until = cell(destination["blocked_until"])
    reason = cell(destination["reason"])
    if destination["state"] == "held":
        return f"held: {name} until {until} ({reason})"
    failed = destination["failed_probes"]
    if destination["state"] == "probing":
        return f"breaker open: {name}, its probe is out ({failed} failed before; {reason})"
    if destination["blocked_until"] <= now:
        # the back-off has passed: the next claim that meets one of its messages
        # sends the probe (none is due, or no dispatcher runs)
        return (
            f"breaker open: {name}, a probe is due since {until}, with its next message "
            f"({failed} failed; {reason})"
        )
    return f"breaker open: {name}, next probe at {until} ({failed} failed; {reason})"


def _secrets_warnings(secrets: dict[str, Any], ring: Keyring | None) -> list[str]:
    """What an operator should know of how signing secrets are stored: some in plain
    text; and, given the keys, some sealed under keys not given or not the first."""
    warnings = []
    if secrets["plain_text"]:
        warnings.append(
            f"{secrets['plain_text']} signing secret(s), client key(s) or endpoint "
            "credential(s) are stored in "
            "plain text: "
            "configure a key and run `outbox endpoints rekey` (see the README, "
            '"Secrets at rest")'
        )
    if ring is not None:
        missing = ring.missing(secrets["sealed"])
        if missing:
            warnings.append(
                f"signing secrets are sealed under key(s) {', '.join(missing)}, "
                "which are not configured here"
            )
        older = sum(n for key, n in secrets["sealed"].items() if key != ring.current)
        if older:
            warnings.append(
                f"{older} signing secret(s) are sealed under keys other than the first "
                f"({ring.current}): run `outbox endpoints rekey`"
            )
    return warnings


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "replay",
        help="send an endpoint's delivered messages again, or an old event to a new endpoint",
        description="Send the messages delivered to one endpoint in a time window again, "
        "with their original webhook-id (receivers that dedupe ignore them); or, with "
        "--event, send one recorded event to an endpoint that did not get it (one "
        "subscribed since: publishing a key again writes nothing). TIME is "
        "ISO 8601 with an offset or Z, or a span ago such as 30m, 2h, 7d.",
    )
    add_database_options(p)
    p.add_argument(
        "--endpoint",
        type=database_id,
        required=True,
        metavar="ID",
        help="the endpoint whose delivered messages to send again, or to send --event to",
    )
    p.add_argument("--since", type=parse_time, metavar="TIME", help="delivered at or after TIME")
    p.add_argument(
        "--event",
        metavar="KEY",
        help="send the event published under KEY to the endpoint (no --since, --until)",
    )
    p.add_argument("--until", type=parse_time, metavar="TIME", help="delivered before TIME")
    p.add_argument("--json", action="store_true", help="print the count as JSON")
    p.set_defaults(handler=cmd_replay, name="replay")

    group = commands.add_parser(
        "messages",
        help="inspect messages",
        description="Look at one message, wherever it is: waiting, in flight, paused, "
        "dead or delivered (until retention removes it).",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = actions.add_parser(
        "show",
        help="show a message and its attempts",
        description="Show a message (waiting, running, paused, dead or delivered) and "
        "every attempt to deliver it. Header values and the body are hidden unless asked "
        "for: they may hold credentials and personal data.",
    )
    add_database_options(p)
    p.add_argument("id", type=database_id, metavar="ID", help="the message's id")
    p.add_argument("--show-headers", action="store_true", help="print header values")
    p.add_argument("--show-body", action="store_true", help="print the body")
    p.add_argument("--json", action="store_true", help="print the message as JSON")
    p.set_defaults(handler=cmd_messages_show, name="messages show")

    p = commands.add_parser(
        "status",
        help="backlog, lag, lease health and endpoint health",
        description="Counts by state, how long the oldest due message has waited, "
        "recent deliveries and failures, and the health of each endpoint.",
    )
    add_database_options(p)
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.add_argument(
        "--max-lag",
        type=seconds_or_zero,
        metavar="SECONDS",
        help="exit 1 when the oldest due message has waited longer than this",
    )
    p.add_argument(
        "--watch",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="refresh every SECONDS until interrupted (one JSON object per refresh with --json)",
    )
    add_secrets_key_option(p)
    p.set_defaults(handler=cmd_status, name="status")
