"""``outbox tenants``: add, list, show, update, delete the tenants that own endpoints.

A tenant is a customer of the product, named by the id the product gives it
(``customer-17``). Its endpoints (``outbox endpoints add URL --tenant ID``) get
the events published for it (``Outbox.publish(..., tenant="customer-17")``) and
no others; its rate limit and retry schedule are the defaults of the endpoints
added to it.
"""

from __future__ import annotations

import argparse
import json

from dispatchers.cli._common import (
    Commands,
    Handler,
    UsageError,
    add_database_options,
    confirm,
    naming_options,
    retry_schedule,
    transaction,
)
from dispatchers.cli._endpoint_settings import parse_metadata
from dispatchers.cli._exit import ExitCode
from dispatchers.cli._render import emit, fields, table
from dispatchers.cli.destinations import rate_options
from dispatchers.ui.policy_text import format_schedule, rate_text
from outbox.tenants import MAX_TENANT_PAGE, Tenant, Tenants

OPTIONS = {
    "external_id": "ID",
    "name": "--name",
    "metadata": "--metadata",
    "rate_limit": "--rate-limit",
    "burst": "--burst",
    "retry_schedule": "--retry-schedule",
}
"""The option that gives each field of :class:`~outbox.tenants.Tenants`, named
when the field is refused."""


def _tenant_fields(tenant: Tenant) -> str:
    return fields(
        [
            ("id", tenant.external_id),
            ("name", tenant.name or None),
            ("endpoints", tenant.endpoints),
            ("rate limit", rate_text(tenant.rate_limit_per_s, tenant.burst)),
            ("retry schedule", format_schedule(tenant.retry_schedule)),
            ("metadata", json.dumps(tenant.metadata) if tenant.metadata else None),
            ("created", tenant.created_at),
            ("updated", tenant.updated_at),
        ]
    )


def cmd_tenants_add(args: argparse.Namespace) -> ExitCode:
    metadata = parse_metadata(args.metadata)
    with naming_options(OPTIONS), transaction(args) as conn:
        tenant = Tenants(schema=args.schema).add(
            conn,
            args.id,
            name=args.tenant_name or "",
            metadata=metadata,
            rate_limit=args.rate_limit,
            burst=args.burst,
            retry_schedule=args.retry_schedule,
        )
    emit(args, tenant.as_dict(), f"created tenant {tenant.external_id}")
    return ExitCode.OK


def cmd_tenants_list(args: argparse.Namespace) -> ExitCode:
    tenants = Tenants(schema=args.schema)
    listed: list[Tenant] = []
    after = None
    with naming_options(OPTIONS), transaction(args) as conn:
        while True:  # every page, in one transaction: a consistent list
            page = tenants.all(conn, after=after)
            listed += page
            if len(page) < MAX_TENANT_PAGE:
                break
            after = page[-1].external_id
    rows = [
        (t.external_id, t.name, t.endpoints, rate_text(t.rate_limit_per_s, t.burst), t.created_at)
        for t in listed
    ]
    text = (
        table(["ID", "NAME", "ENDPOINTS", "RATE LIMIT", "CREATED"], rows) if rows else "no tenants"
    )
    emit(args, [t.as_dict() for t in listed], text)
    return ExitCode.OK


def cmd_tenants_show(args: argparse.Namespace) -> ExitCode:
    with naming_options(OPTIONS), transaction(args) as conn:
        tenant = Tenants(schema=args.schema).require(conn, args.id)
    emit(args, tenant.as_dict(), _tenant_fields(tenant))
    return ExitCode.OK


def cmd_tenants_update(args: argparse.Namespace) -> ExitCode:
    changes = {
        "name": args.tenant_name,
        "metadata": parse_metadata(args.metadata),
        "rate_limit": args.rate_limit,
        "burst": args.burst,
        "clear_rate_limit": args.no_rate_limit,
        "retry_schedule": args.retry_schedule,
        "clear_retry_schedule": args.no_retry_schedule,
    }
    if not any(value not in (None, False) for value in changes.values()):
        raise UsageError(
            "nothing to change: give --name, --metadata, --rate-limit, --burst, "
            "--no-rate-limit, --retry-schedule or --no-retry-schedule"
        )
    with naming_options(OPTIONS), transaction(args) as conn:
        tenant = Tenants(schema=args.schema).update(conn, args.id, **changes)
    emit(args, tenant.as_dict(), _tenant_fields(tenant))
    return ExitCode.OK


def cmd_tenants_delete(args: argparse.Namespace) -> ExitCode:
    tenants = Tenants(schema=args.schema)

    def question() -> str:
        with naming_options(OPTIONS), transaction(args) as conn:
            tenant = tenants.require(conn, args.id)
        return (
            f"Delete tenant {tenant.external_id} and its {tenant.endpoints} endpoint(s)? "
            "Their waiting messages become dead; delivered history is kept."
        )

    if not confirm(args, f"delete tenant {args.id}", question):
        return ExitCode.FAILURE
    with naming_options(OPTIONS), transaction(args) as conn:
        deleted = tenants.delete(conn, args.id)
    emit(
        args,
        {"id": args.id, "deleted": True, **deleted._asdict()},
        f"deleted tenant {args.id} and {deleted.endpoints} endpoint(s) "
        f"({deleted.messages} waiting message(s) of theirs are now dead)",
    )
    return ExitCode.OK


def add_parser(commands: Commands) -> None:
    group = commands.add_parser(
        "tenants",
        help="add, list, show, update, delete tenants (the customers that own endpoints)",
        description="Tenants: the customers of a product, each owning endpoints that get "
        "only the events published for it (publish(..., tenant=ID)).",
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
        add_database_options(p)
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.set_defaults(handler=handler, name=f"tenants {name}")
        return p

    def identified(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "id",
            metavar="ID",
            help="the tenant's id, chosen by the product: 1-128 letters, digits and "
            "._:@- starting with a letter or digit, e.g. customer-17",
        )

    def defaults(p: argparse.ArgumentParser) -> None:
        p.add_argument("--name", dest="tenant_name", metavar="NAME", help="a name to show for it")
        p.add_argument("--metadata", metavar="JSON", help="a JSON object stored with it")
        rate_options(p)
        p.add_argument(
            "--retry-schedule",
            type=retry_schedule,
            metavar="DELAYS",
            help="the retry schedule of the endpoints added to it, e.g. 5s,1m,10m,1h",
        )

    p = action("add", cmd_tenants_add, "add a tenant")
    identified(p)
    defaults(p)

    action("list", cmd_tenants_list, "list the tenants")

    p = action("show", cmd_tenants_show, "show one tenant")
    identified(p)

    p = action(
        "update",
        cmd_tenants_update,
        "change a tenant's name, metadata or defaults (endpoints added from now on "
        "take the new defaults; existing ones keep theirs)",
    )
    identified(p)
    defaults(p)
    p.add_argument("--no-rate-limit", action="store_true", help="remove the default rate limit")
    p.add_argument(
        "--no-retry-schedule", action="store_true", help="remove the default retry schedule"
    )

    p = action("delete", cmd_tenants_delete, "delete a tenant and its endpoints")
    identified(p)
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
