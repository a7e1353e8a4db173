"""``outbox demo``: the whole contract end to end on this machine (the body of
the demo is :mod:`dispatchers.demo`)."""

from __future__ import annotations

import argparse

from dispatchers.cli._common import (
    Commands,
    add_database_options,
    positive_float,
    positive_int,
    require_extra,
    resolve_database,
)
from dispatchers.cli._exit import ExitCode


def cmd_demo(args: argparse.Namespace) -> ExitCode:
    require_extra("dispatcher")
    from dispatchers.demo import run_demo

    db = resolve_database(args)
    held = run_demo(db.url, events=args.events, rate=args.rate, seed=args.seed)
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
    p.set_defaults(handler=cmd_demo)
