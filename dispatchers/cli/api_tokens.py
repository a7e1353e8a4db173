"""``outbox api-tokens``: create, list and revoke the management API's bearer
tokens (see :mod:`dispatchers.api.tokens`).

``create`` prints the token alone on stdout, once: only its SHA-256 is stored,
so it cannot be shown again (what it was made as goes to stderr). ``list``
shows each token by its first characters, never in full. ``revoke`` keeps the
token's row, so that the audit log still names who acted.
"""

from __future__ import annotations

import argparse
import sys

from dispatchers.api.store import UnknownTenant, create_token, list_tokens, revoke_token
from dispatchers.api.tokens import MAX_NAME, SCOPES, Scope
from dispatchers.cli._common import (
    Commands,
    Handler,
    UsageError,
    add_database_options,
    database_id,
    transaction,
)
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit, table


def _name(text: str) -> str:
    if len(text) > MAX_NAME or not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be at most {MAX_NAME} printable characters")
    return text


def cmd_api_tokens_create(args: argparse.Namespace) -> ExitCode:
    scope: Scope = args.scope
    with transaction(args) as conn:
        try:
            token_id, token = create_token(
                conn, args.schema, scope=scope, name=args.name, tenant=args.tenant
            )
        except UnknownTenant:
            raise UsageError(f"--tenant: no tenant {args.tenant!r}") from None
    whose = f"of tenant {args.tenant}" if args.tenant else "of the operator"
    print(
        f"outbox api-tokens create: created token {token_id} ({scope} scope, {whose}); it "
        "is printed once, on stdout: store it now",
        file=sys.stderr,
    )
    print(token)
    return ExitCode.OK


def cmd_api_tokens_list(args: argparse.Namespace) -> ExitCode:
    with transaction(args) as conn:
        tokens = list_tokens(conn, args.schema)
    text = (
        table(
            ["ID", "NAME", "SCOPE", "TENANT", "TOKEN", "CREATED", "LAST USED", "REVOKED"],
            [
                (
                    t.id,
                    t.name or None,
                    t.scope,
                    t.tenant,
                    t.shown_prefix + "…",
                    t.created_at,
                    t.last_used_at,
                    t.revoked_at,
                )
                for t in tokens
            ],
        )
        if tokens
        else "no API tokens"
    )
    emit(args, [t._asdict() for t in tokens], text)
    return ExitCode.OK


def cmd_api_tokens_revoke(args: argparse.Namespace) -> ExitCode:
    with transaction(args) as conn:
        revoked = revoke_token(conn, args.schema, args.id)
    if revoked is None:
        print(f"outbox api-tokens revoke: no token with id {args.id}", file=sys.stderr)
        return ExitCode.FAILURE
    emit(
        args,
        {"id": args.id, "revoked": True},
        f"revoked token {args.id}" if revoked else f"token {args.id} was revoked already",
    )
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    group = commands.add_parser(
        "api-tokens",
        help="create, list and revoke the management API's bearer tokens",
        description="Bearer tokens of the management API (outbox ui serves it under "
        "/api/v1). A read token may use the GET routes, a write token every route; a "
        "token made for a tenant sees and changes that tenant's endpoints and their "
        "messages only. Only a token's SHA-256 is stored.",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        add_database_options(p)
        p.set_defaults(handler=handler, name=f"api-tokens {name}")
        return p

    p = action(
        "create",
        cmd_api_tokens_create,
        "make a token and print it alone on stdout, once (it is stored hashed and "
        "cannot be shown again)",
    )
    p.add_argument(
        "--scope",
        choices=SCOPES,
        required=True,
        help="read: the GET routes; write: every route",
    )
    p.add_argument(
        "--tenant",
        metavar="ID",
        help="bind the token to this tenant (its external id): it sees and changes that "
        "tenant's endpoints and their messages only, and no operator route",
    )
    p.add_argument(
        "--name",
        type=_name,
        default="",
        metavar="NAME",
        help="what the token is for, shown by list and recorded in the audit log",
    )

    p = action("list", cmd_api_tokens_list, "list the tokens (by their first characters)")
    p.add_argument("--json", action="store_true", help="print the tokens as JSON")

    p = action(
        "revoke",
        cmd_api_tokens_revoke,
        "revoke a token: its next request is refused (the audit log keeps its name)",
    )
    p.add_argument("id", type=database_id, metavar="ID", help="the token's id (from list)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
