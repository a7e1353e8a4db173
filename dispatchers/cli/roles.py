"""``outbox roles``: print, or apply, the least-privilege grants of the outbox schema.

The statements come from :func:`outbox.roles.grants`; this command checks the
roles first (each must exist, and be neither a superuser nor the schema's owner),
then prints the statements or, with ``--apply``, runs them in one transaction.
"""

from __future__ import annotations

import argparse

from dispatchers.cli._common import Commands, UsageError, add_database_options, transaction
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit
from outbox.roles import ROLES, check_roles, grants


def cmd_roles(args: argparse.Namespace) -> ExitCode:
    roles = {kind: getattr(args, kind) for kind in ROLES if getattr(args, kind) is not None}
    if not roles:
        raise UsageError("name at least one role: --producer, --dispatcher or --operator")
    statements = grants(args.schema, **roles)
    with transaction(args) as conn:
        check_roles(conn, args.schema, roles)
        if args.apply:
            for statement in statements:
                # the grants the library wrote (outbox.roles.grants), applied as asked
                conn.execute(statement.encode())
    script = "\n".join(f"{statement};" for statement in statements)
    if args.apply:
        text = f"{script}\n-- applied: {len(statements)} statements for {', '.join(roles)}"
    else:
        text = script
    data = {"schema": args.schema, "roles": roles, "statements": statements, "applied": args.apply}
    emit(args, data, text)
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    p = commands.add_parser(
        "roles",
        help="grant existing roles exactly what a producer, dispatcher or operator needs",
        description="Print the SQL that gives each named role exactly the privileges its "
        "statements need in the outbox schema, table by table and column by column, or "
        "run it with --apply. The roles must exist. A producer (the application) "
        "enqueues and publishes: of an endpoint it reads the subscriptions alone (no URL, "
        "TLS material nor signing secret), and it cannot read back nor change a message; "
        "a dispatcher delivers: it writes a message's state, lease and outcome, never "
        "what it says, and an endpoint's health, never its URL, subscriptions or secrets, "
        "and it may disable an endpoint but not enable it; an operator runs the admin "
        "commands and the dashboard. The owner of the schema runs `outbox migrate` and "
        "this command; run it again after each migration.",
    )
    add_database_options(p)
    for kind in ROLES:
        p.add_argument(f"--{kind}", metavar="ROLE", help=f"the {kind}'s role (it must exist)")
    p.add_argument("--apply", action="store_true", help="run the statements (as the owner)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_roles)
