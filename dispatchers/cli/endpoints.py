"""``outbox endpoints``: add, list, show, update, disable, enable, rotate-secret,
rekey, delete.

A signing secret is printed in full only where it is made or asked for
(``show --show-secrets``), else by its fingerprint. With a key configured, new
secrets, the TLS private key and the credentials are stored sealed; only digests
of PEM texts, the headers' names and the scheme are ever shown. Material is
checked before anything is written.

Design: docs/explanation/design/cli.md
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

from dispatchers.cli._common import (
    Commands,
    Handler,
    UsageError,
    add_database_options,
    add_secrets_key_option,
    confirm,
    database_id,
    hours,
    integer,
    keyring,
    naming_options,
    resolve_database,
    transaction,
)
from dispatchers.cli._endpoint_auth import naming_auth_options
from dispatchers.cli._endpoint_settings import OPTIONS, add_settings_options, settings
from dispatchers.cli._endpoint_tls import naming_tls_options
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import cell, emit, fields, table
from dispatchers.ui.policy_text import auth_fields, format_schedule, rate_text, tls_fields
from outbox.endpoints import (
    DEFAULT_ROTATION_OVERLAP,
    MAX_RESEAL_BATCH,
    RESEAL_BATCH,
    Endpoints,
)
from outbox.secrets import fingerprint

if TYPE_CHECKING:
    from outbox.endpoints import Endpoint

_HOUR = timedelta(hours=1)


def _endpoint_fields(ep: Endpoint, *, show_secrets: bool) -> str:
    pairs: list[tuple[str, object]] = [
        ("id", ep.id),
        ("url", ep.url),
        ("tenant", ep.tenant),
        ("description", ep.description or None),
        ("event types", ", ".join(ep.event_types) or "* (every event type)"),
        ("filter", ep.filter),
        ("enabled", "yes" if ep.enabled else f"no: {ep.disabled_reason or 'disabled'}"),
    ]
    if not ep.enabled:
        pairs.append(("disabled at", ep.disabled_at))
    pairs += [
        ("failure streak", ep.failure_streak),
        ("failing since", ep.failing_since),
        ("last success", ep.last_success_at),
        ("max concurrency", ep.max_concurrency),
        ("rate limit", rate_text(ep.rate_limit_per_s, ep.burst)),
        ("retry schedule", format_schedule(ep.retry_schedule)),
        ("metadata", json.dumps(ep.metadata) if ep.metadata else None),
    ]
    for i, secret in enumerate(ep.secrets):
        shown = secret.secret if show_secrets else fingerprint(secret.secret)
        until = f" (signs until {cell(secret.expires_at)})" if secret.expires_at else ""
        pairs.append(("secrets" if i == 0 else "", shown + until))
    pairs += tls_fields(ep)
    pairs += auth_fields(ep)
    pairs += [("created", ep.created_at), ("updated", ep.updated_at)]
    return fields(pairs)


def _endpoints(args: argparse.Namespace) -> Endpoints:
    """The endpoints of ``--schema``, their secrets sealed by the configured key."""
    return Endpoints(schema=args.schema, keyring=keyring(args))


def cmd_endpoints_add(args: argparse.Namespace) -> ExitCode:
    chosen = settings(args, update=False)
    endpoints = _endpoints(args)
    with (
        naming_options({**OPTIONS, "url": "URL"}),
        naming_tls_options(),
        naming_auth_options(args),
        transaction(args) as conn,
    ):
        ep = endpoints.add(conn, url=args.url, secret=args.secret, tenant=args.tenant, **chosen)
    secret = ep.secrets[0].secret
    emit(
        args,
        {**ep.as_dict(show_secrets=True), "secret": secret},
        f"created endpoint {ep.id}: {ep.url}\n"
        f"signing secret: {secret} (fingerprint {fingerprint(secret)})\n"
        "(shown in full only here; `outbox endpoints show "
        f"{ep.id} --show-secrets` prints it again)",
    )
    return ExitCode.OK


def cmd_endpoints_list(args: argparse.Namespace) -> ExitCode:
    endpoints = _endpoints(args)
    with transaction(args) as conn:
        listed = endpoints.all(conn, tenant=args.tenant)
    rows = [
        (
            ep.id,
            ep.tenant,
            ep.url,
            ep.enabled,
            ", ".join(ep.event_types) or "*",
            ep.filter,
            ep.failure_streak,
            ep.last_success_at,
            ep.description,
        )
        for ep in listed
    ]
    text = (
        table(
            [
                "ID",
                "TENANT",
                "URL",
                "ENABLED",
                "EVENT TYPES",
                "FILTER",
                "FAILURES",
                "LAST SUCCESS",
                "DESCRIPTION",
            ],
            rows,
        )
        if rows
        else "no endpoints"
    )
    emit(args, [ep.as_dict() for ep in listed], text)
    return ExitCode.OK


def cmd_endpoints_show(args: argparse.Namespace) -> ExitCode:
    endpoints = _endpoints(args)
    with transaction(args) as conn:
        ep = endpoints.require(conn, args.id)
    emit(
        args,
        ep.as_dict(show_secrets=args.show_secrets),
        _endpoint_fields(ep, show_secrets=args.show_secrets),
    )
    return ExitCode.OK


def cmd_endpoints_update(args: argparse.Namespace) -> ExitCode:
    chosen = settings(args, update=True)
    endpoints = _endpoints(args)
    with (
        naming_options(OPTIONS),
        naming_tls_options(),
        naming_auth_options(args),
        transaction(args) as conn,
    ):
        ep = endpoints.update(conn, args.id, **chosen)
    emit(
        args, ep.as_dict(), f"updated endpoint {ep.id}\n{_endpoint_fields(ep, show_secrets=False)}"
    )
    return ExitCode.OK


def cmd_endpoints_disable(args: argparse.Namespace) -> ExitCode:
    endpoints = _endpoints(args)
    with naming_options(OPTIONS), transaction(args) as conn:
        paused = endpoints.disable(conn, args.id, reason=args.reason)
    emit(
        args,
        {"id": args.id, "enabled": False, "paused": paused},
        f"disabled endpoint {args.id}; paused {paused} waiting message(s)",
    )
    return ExitCode.OK


def cmd_endpoints_enable(args: argparse.Namespace) -> ExitCode:
    endpoints = _endpoints(args)
    with transaction(args) as conn:
        resumed = endpoints.enable(conn, args.id)
    emit(
        args,
        {"id": args.id, "enabled": True, "resumed": resumed},
        f"enabled endpoint {args.id}; resumed {resumed} paused message(s)",
    )
    return ExitCode.OK


def cmd_endpoints_test(args: argparse.Namespace) -> ExitCode:
    from outbox.admin import send_test_event

    with transaction(args) as conn:
        message_id = send_test_event(conn, schema=args.schema, endpoint_id=args.id)
    emit(
        args,
        {"id": args.id, "message_id": message_id},
        f"sent a test event to endpoint {args.id} as message {message_id} (one attempt; "
        f"`outbox messages show {message_id}` shows its outcome)",
    )
    return ExitCode.OK


def cmd_endpoints_rotate_secret(args: argparse.Namespace) -> ExitCode:
    overlap = timedelta(hours=args.overlap)
    endpoints = _endpoints(args)
    with naming_options(OPTIONS), transaction(args) as conn:
        ep = endpoints.rotate_secret(conn, args.id, secret=args.secret, overlap=overlap)
    new = ep.secrets[0].secret
    previous = [s.expires_at for s in ep.secrets[1:] if s.expires_at is not None]
    until = f"\nthe previous secret(s) keep signing until {cell(max(previous))}" if previous else ""
    emit(
        args,
        {"id": ep.id, "secret": new, "previous_secrets_expire_at": max(previous, default=None)},
        f"new signing secret for endpoint {ep.id}: {new} (fingerprint {fingerprint(new)}){until}",
    )
    return ExitCode.OK


def cmd_endpoints_rekey(args: argparse.Namespace) -> ExitCode:
    """Seal every signing secret under the current key, a batch per transaction,
    with a progress line per batch on stderr."""
    endpoints = _endpoints(args)
    if endpoints.keyring is None:
        raise UsageError("no key to seal with: give --secrets-key-file or set OUTBOX_SECRETS_KEY")
    current = endpoints.keyring.current
    # resolved once (and the embedded server held) for every batch
    args.database_url = resolve_database(args).url
    with transaction(args) as conn:
        total = endpoints.unsealed(conn)
    sealed = 0
    while batch := _reseal_batch(args, endpoints):
        sealed += batch
        print(
            f"outbox endpoints rekey: sealed {sealed} of {total} secret(s) under key {current}",
            file=sys.stderr,
        )
    with transaction(args) as conn:
        remaining = endpoints.unsealed(conn)
    text = f"sealed {sealed} secret(s) under key {current}"
    if remaining:
        text += f"; {remaining} remain (changed meanwhile): run it again"
    emit(args, {"key_id": current, "sealed": sealed, "remaining": remaining}, text)
    return ExitCode.FAILURE if remaining else ExitCode.OK


def _reseal_batch(args: argparse.Namespace, endpoints: Endpoints) -> int:
    with transaction(args) as conn:
        return endpoints.reseal(conn, limit=args.batch)


def cmd_endpoints_delete(args: argparse.Namespace) -> ExitCode:
    endpoints = _endpoints(args)

    def question() -> str:
        with transaction(args) as conn:
            ep = endpoints.require(conn, args.id)
        return (
            f"Delete endpoint {ep.id} ({ep.url})? Its waiting messages become dead; "
            "delivered history is kept."
        )

    if not confirm(args, f"delete endpoint {args.id}", question):
        return ExitCode.FAILURE
    with transaction(args) as conn:
        had = endpoints.delete(conn, args.id)
    emit(
        args,
        {"id": args.id, "deleted": True, "messages": had},
        f"deleted endpoint {args.id} ({had} message(s) of it were in the outbox; "
        "the waiting ones are now dead)",
    )
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    group = commands.add_parser(
        "endpoints",
        help="manage webhook endpoints",
        description="Webhook endpoints: where published events are delivered, signed "
        "with the endpoint's secrets (Standard Webhooks).",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        add_database_options(p)
        add_secrets_key_option(p)
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(handler=handler, name=f"endpoints {name}")
        return p

    p = action("add", cmd_endpoints_add, "register an endpoint; prints its id and secret")
    p.add_argument("url", metavar="URL", help="http(s) URL to POST events to")
    add_settings_options(p, update=False)
    p.add_argument("--secret", help="whsec_... signing secret (default: a new random one)")
    p.add_argument(
        "--tenant",
        metavar="ID",
        help="the tenant it belongs to (`outbox tenants add`): it then gets only the "
        "events published for that tenant, and takes the tenant's rate limit and retry "
        "schedule unless given its own; fixed once the endpoint exists",
    )

    p = action("list", cmd_endpoints_list, "list the endpoints")
    p.add_argument("--tenant", metavar="ID", help="only this tenant's endpoints")

    p = action("show", cmd_endpoints_show, "show one endpoint")
    p.add_argument("id", type=database_id, metavar="ID", help="the endpoint's id")
    p.add_argument("--show-secrets", action="store_true", help="print the secrets in full")

    p = action("update", cmd_endpoints_update, "change an endpoint's settings")
    p.add_argument("id", type=database_id, metavar="ID", help="the endpoint's id")
    p.add_argument("--url", help="new http(s) URL")
    add_settings_options(p, update=True)

    p = action("disable", cmd_endpoints_disable, "stop delivering to an endpoint")
    p.add_argument("id", type=database_id, metavar="ID", help="the endpoint's id")
    p.add_argument("--reason", default="disabled by an operator", help="why (shown in status)")

    p = action("enable", cmd_endpoints_enable, "resume delivering to an endpoint")
    p.add_argument("id", type=database_id, metavar="ID", help="the endpoint's id")

    p = action(
        "test",
        cmd_endpoints_test,
        "send an endpoint a signed test event (type outbox.test), with one attempt",
    )
    p.add_argument("id", type=database_id, metavar="ID", help="the endpoint's id")

    p = action(
        "rotate-secret",
        cmd_endpoints_rotate_secret,
        "sign with a new secret; the old ones keep signing during the overlap",
    )
    p.add_argument("id", type=database_id, metavar="ID", help="the endpoint's id")
    p.add_argument("--secret", help="the new whsec_... secret (default: a new random one)")
    overlap = DEFAULT_ROTATION_OVERLAP / _HOUR
    p.add_argument(
        "--overlap",
        type=hours,
        default=overlap,
        metavar="HOURS",
        help=f"hours the previous secrets keep signing (default: {overlap:g})",
    )

    p = action(
        "rekey",
        cmd_endpoints_rekey,
        "seal every signing secret, client key and endpoint's credentials under the "
        "first configured key (plain-text ones included); safe while dispatchers "
        "holding the old and new keys run",
    )
    p.add_argument(
        "--batch",
        type=integer(1, MAX_RESEAL_BATCH),
        default=RESEAL_BATCH,
        metavar="N",
        help=f"secrets sealed per transaction (default: {RESEAL_BATCH})",
    )

    p = action("delete", cmd_endpoints_delete, "delete an endpoint (its waiting messages die)")
    p.add_argument("id", type=database_id, metavar="ID", help="the endpoint's id")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
