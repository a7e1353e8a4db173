"""``outbox demo``: the whole contract end to end on this machine (the body of
the demo is :mod:`dispatchers.demo`)."""

from __future__ import annotations

import argparse
import sys

from dispatchers.cli._common import (
    Commands,
    add_database_options,
    port,
    positive_float,
    positive_int,
    require_extra,
    resolve_database,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli.ui import DEFAULT_HOST, DEFAULT_PORT, serve_dashboard


def cmd_demo(args: argparse.Namespace) -> ExitCode:
    require_extra("dispatcher")
    if args.ui:
        require_extra("ui")
    from dispatchers.demo import SCHEMA, run_demo

    db = resolve_database(args)
    held = run_demo(db.url, events=args.events, rate=args.rate, seed=args.seed)
    if args.ui:
        print(
            f"outbox demo: the dashboard shows the demo's schema ({SCHEMA}) until interrupted",
            file=sys.stderr,
        )
        serve_dashboard(
            db.url, schema=SCHEMA, host=DEFAULT_HOST, port=args.ui_port, read_only=False, token=None
        )
    return ExitCode.OK if held else ExitCode.FAILURE


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "demo",
        help="run the whole contract end to end on this machine (embedded database)",
        description="Publish order events from business transactions (some rolled back), "
        "deliver them as signed webhooks to a local receiver that fails some requests "
        "once after applying them, and check every invariant. Uses the schemas "
        "outbox_demo and outbox_demo_inbox (dropped and recreated). Exit 0 only if "
        "every invariant held.",
    )
    add_database_options(p, schema=False)
    p.add_argument("--events", type=positive_int, default=1000, help="events (default: 1000)")
    p.add_argument(
        "--rate",
        type=positive_float,
        default=150.0,
        help="business transactions per second (default: 150)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed, for a repeatable run")
    p.add_argument(
        "--ui",
        action="store_true",
        help=f"after the summary, serve the dashboard on the demo's data on {DEFAULT_HOST} "
        "until interrupted (needs the ui extra)",
    )
    p.add_argument(
        "--ui-port",
        type=port,
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"the dashboard's port with --ui (default: {DEFAULT_PORT}; 0 picks a free one)",
    )
    p.set_defaults(handler=cmd_demo)
