"""``outbox expunge``: erase what messages said, keeping their delivery record.

One of ``--event KEY [--tenant ID]``, ``--endpoint ID --before TIME`` or
``--key KEY`` chooses the messages; their bodies, headers and recorded answers
are replaced with a marker in the hot table and the history (see
:mod:`outbox._expunge`). It asks first, unless given ``--yes``.
"""

from __future__ import annotations

import argparse

from dispatchers.cli._common import (
    Commands,
    UsageError,
    add_database_options,
    confirm,
    database_id,
    naming_options,
    parse_time,
    transaction,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit
from outbox.admin import expunge

OPTIONS = {
    "event_key": "--event",
    "tenant": "--tenant",
    "endpoint_id": "--endpoint",
    "before": "--before",
    "idempotency_key": "--key",
}
"""The option that gives each argument of :func:`outbox.admin.expunge`."""


def _chosen(args: argparse.Namespace) -> tuple[dict[str, object], str]:
    """The arguments of ``expunge`` the options ask for, and what they choose,
    in words; a usage error unless exactly one way of choosing is given."""
    ways = [args.event is not None, args.endpoint is not None, args.key is not None]
    if sum(ways) != 1:
        raise UsageError("give exactly one of --event KEY, --endpoint ID --before TIME, --key KEY")
    if args.tenant is not None and args.event is None:
        raise UsageError("--tenant goes with --event")
    if (args.before is not None) != (args.endpoint is not None):
        raise UsageError("--endpoint and --before go together")
    if args.event is not None:
        owner = f" of tenant {args.tenant}" if args.tenant else ""
        return {"event_key": args.event, "tenant": args.tenant}, f"event {args.event}{owner}"
    if args.endpoint is not None:
        return (
            {"endpoint_id": args.endpoint, "before": args.before},
            f"the messages of endpoint {args.endpoint} created before {args.before.isoformat()}",
        )
    return {"idempotency_key": args.key}, f"the messages with key {args.key}"


def cmd_expunge(args: argparse.Namespace) -> ExitCode:
    arguments, what = _chosen(args)

    def question() -> str:
        return (
            f"Erase the bodies, headers and recorded answers of {what}? Their ids, "
            "keys, times and statuses are kept; waiting ones are cancelled. This "
            "cannot be undone."
        )

    if not confirm(args, "expunge", question):
        return ExitCode.FAILURE
    with naming_options(OPTIONS), transaction(args) as conn:
        done = expunge(conn, schema=args.schema, **arguments)  # type: ignore[arg-type]
    text = (
        f"expunged {what}: {done.messages} waiting or dead message(s) "
        f"({done.cancelled} cancelled before delivery), {done.history} delivered"
    )
    if done.running:
        text += (
            f"; {done.running} being sent now were left as they are: "
            "run the same command again once they are recorded"
        )
    emit(args, {**done._asdict(), "chosen": what}, text)
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "expunge",
        help="erase what messages said (GDPR), keeping their delivery record",
        description="Replace the bodies, headers and recorded receiver answers of the "
        "chosen messages with a marker, in the outbox and its delivered history, keeping "
        "their ids, keys, times, statuses and digests; waiting messages are cancelled, and "
        "an expunged event or message is refused by replay. Each erasure is recorded in "
        "the expunges table (what was asked, how many rows; never the content). TIME is "
        "ISO 8601 with an offset or Z, or a span ago such as 30d.",
    )
    add_database_options(p)
    p.add_argument("--event", metavar="KEY", help="the event published under KEY")
    p.add_argument("--tenant", metavar="ID", help="the tenant the --event was published for")
    p.add_argument("--endpoint", type=database_id, metavar="ID", help="an endpoint's messages")
    p.add_argument(
        "--before", type=parse_time, metavar="TIME", help="with --endpoint: created before TIME"
    )
    p.add_argument("--key", metavar="KEY", help="every message with this idempotency key")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(handler=cmd_expunge, name="expunge")
