"""The settings options of ``outbox endpoints add`` and ``update`` (those of
TLS and credentials are :mod:`~dispatchers.cli._endpoint_tls`'s and
:mod:`~dispatchers.cli._endpoint_auth`'s), and the
keyword arguments of :meth:`outbox.endpoints.Endpoints.add` and ``update`` they
make.

One table (:data:`_UPDATE_OPTIONS`) names every option that changes a setting,
so that ``update`` with none of them and the message saying which to give cannot
drift apart; each pair of an option and the one that removes its setting is
refused together before anything is read from the database. The values are
checked where :class:`~outbox.endpoints.Endpoints` checks them, except the
metadata's JSON and the filter's extra, which only the command line reads.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from dispatchers.cli._common import (
    UsageError,
    positive_int,
    require_extra,
    retry_schedule,
)
from dispatchers.cli._endpoint_auth import (
    AUTH_EXCLUSIVE,
    AUTH_UPDATE_OPTIONS,
    add_auth_options,
    auth_arguments,
)
from dispatchers.cli._endpoint_tls import add_tls_options, pem_texts
from dispatchers.cli.destinations import rate_options
from outbox.errors import InvalidMessage
from outbox.internal import (
    MAX_FILTER_LENGTH,
    MAX_METADATA_BYTES,
    check_filter,
    check_metadata,
    check_text,
)

__all__ = ["OPTIONS", "add_settings_options", "parse_metadata", "settings"]

OPTIONS = {
    "url": "--url",
    "event_types": "--event-type",
    "description": "--description",
    "metadata": "--metadata",
    "max_concurrency": "--max-concurrency",
    "rate_limit": "--rate-limit",
    "burst": "--burst",
    "retry_schedule": "--retry-schedule",
    "secret": "--secret",
    "reason": "--reason",
    "overlap": "--overlap",
    "tenant": "--tenant",
}
"""The option of ``outbox endpoints`` that gives each field of
:class:`~outbox.endpoints.Endpoints` (the TLS ones are
:mod:`~dispatchers.cli._endpoint_tls`'s), named when the field is refused."""

MAX_METADATA_TEXT = 6 * MAX_METADATA_BYTES
"""The longest ``--metadata`` read: its JSON, stored, is at most
:data:`~outbox._endpoint_fields.MAX_METADATA_BYTES`, and no character of it takes
more than six to write (``\\u00e9``)."""

_UPDATE_OPTIONS = {
    "--url": "url",
    "--event-type": "event_types",
    "--all-event-types": "all_event_types",
    "--description": "description",
    "--metadata": "metadata",
    "--max-concurrency": "max_concurrency",
    "--no-max-concurrency": "no_max_concurrency",
    "--rate-limit": "rate_limit",
    "--burst": "burst",
    "--no-rate-limit": "no_rate_limit",
    "--ca-bundle": "ca_bundle",
    "--no-ca-bundle": "no_ca_bundle",
    "--client-cert": "client_cert",
    "--client-key": "client_key",
    "--no-client-cert": "no_client_cert",
    "--filter": "filter",
    "--clear-filter": "clear_filter",
    "--retry-schedule": "retry_schedule",
    "--no-retry-schedule": "no_retry_schedule",
    **AUTH_UPDATE_OPTIONS,
}
"""Every option of ``update`` that changes a setting, with its destination."""

_EXCLUSIVE = (
    (("--event-type",), "--all-event-types"),
    (("--max-concurrency",), "--no-max-concurrency"),
    (("--rate-limit", "--burst"), "--no-rate-limit"),
    (("--filter",), "--clear-filter"),
    (("--retry-schedule",), "--no-retry-schedule"),
    *AUTH_EXCLUSIVE,
)
"""Options that set a value, and the one that removes it (the TLS options are
refused together by :class:`outbox._endpoint_tls.TlsChange`, naming them)."""


def add_settings_options(p: argparse.ArgumentParser, *, update: bool) -> None:
    """The options of ``add`` (and, with ``update``, of ``update``, with those
    that remove a setting) that set what an endpoint gets and how."""
    p.add_argument(
        "--event-type",
        dest="event_types",
        action="append",
        default=None,
        metavar="TYPE",
        help="subscribe to this event type or prefix.* pattern (repeatable; "
        + ("replaces the list)" if update else "default: every event type)"),
    )
    if update:
        p.add_argument(
            "--all-event-types", action="store_true", help="subscribe to every event type"
        )
    p.add_argument("--description", default=None if update else "", help="free text")
    p.add_argument("--metadata", metavar="JSON", help="a JSON object stored with it")
    p.add_argument(
        "--max-concurrency",
        type=positive_int,
        metavar="N",
        help="most deliveries in flight to it at once",
    )
    if update:
        p.add_argument("--no-max-concurrency", action="store_true", help="remove the cap")
    rate_options(p)
    if update:
        p.add_argument("--no-rate-limit", action="store_true", help="remove the rate limit")
    p.add_argument(
        "--filter",
        metavar="EXPR",
        help="deliver only the events whose payload makes this JMESPath expression "
        f"truthy (at most {MAX_FILTER_LENGTH} characters; needs the 'filters' extra)",
    )
    if update:
        p.add_argument(
            "--clear-filter",
            action="store_true",
            help="remove the filter: every event of its types again",
        )
    p.add_argument(
        "--retry-schedule",
        type=retry_schedule,
        metavar="DELAYS",
        help="delays before each retry of its messages, e.g. 5s,1m,10m,1h (the last "
        "repeats until the attempts are spent; default: the event type's schedule, "
        "else the dispatcher's); applies from the next retry scheduled: a message "
        "already waiting keeps its due time",
    )
    if update:
        p.add_argument(
            "--no-retry-schedule",
            action="store_true",
            help="drop its retry schedule (the event type's or the dispatcher's applies)",
        )
    add_tls_options(p, update=update)
    add_auth_options(p, update=update)


def settings(args: argparse.Namespace, *, update: bool) -> dict[str, Any]:
    """The keyword arguments of ``Endpoints.add`` (or, with ``update``, of
    ``Endpoints.update``) that the options ask for; a usage error for options
    given together that exclude each other, or for an ``update`` that changes
    nothing."""
    if update:
        given = {
            option
            for option, dest in _UPDATE_OPTIONS.items()
            if getattr(args, dest) not in (None, False)
        }
        for (setter, *others), remover in _EXCLUSIVE:
            if remover in given and given.intersection((setter, *others)):
                alternatives = "".join(f" (or {other})" for other in others)
                raise UsageError(f"give {setter}{alternatives} or {remover}, not both")
        if not given:
            *most, last = _UPDATE_OPTIONS
            raise UsageError(f"nothing to change: give {', '.join(most)} or {last}")
    chosen: dict[str, Any] = {
        "event_types": args.event_types,
        "description": args.description,
        "metadata": parse_metadata(args.metadata),
        "max_concurrency": args.max_concurrency,
        "rate_limit": args.rate_limit,
        "burst": args.burst,
        "filter": _payload_filter(args.filter),
        "retry_schedule": args.retry_schedule,
        **pem_texts(args),
        **auth_arguments(args, update=update),
    }
    if update:
        if args.all_event_types:
            chosen["event_types"] = []
        chosen |= {
            "url": args.url,
            "clear_max_concurrency": args.no_max_concurrency,
            "clear_rate_limit": args.no_rate_limit,
            "clear_filter": args.clear_filter,
            "clear_retry_schedule": args.no_retry_schedule,
            "clear_ca_bundle": args.no_ca_bundle,
            "clear_client_cert": args.no_client_cert,
        }
    return chosen


def parse_metadata(text: str | None) -> dict[str, Any] | None:
    """``--metadata``: a JSON object that :class:`~outbox.endpoints.Endpoints`
    stores, or None when not given; else a usage error naming the option. The
    text is bounded before it is parsed, and nesting is refused whether the
    parser or the check finds it first."""
    if text is None:
        return None
    if len(text) > MAX_METADATA_TEXT:
        raise _refused(f"is longer than {MAX_METADATA_TEXT:,} characters")
    try:
        value = json.loads(text)
    except RecursionError:
        raise _refused("nests too deep") from None
    except ValueError as exc:
        raise _refused(f"is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _refused("must be a JSON object")
    try:
        return check_metadata(value)
    except InvalidMessage as exc:
        raise _refused(exc.problem) from None


def _refused(problem: str) -> UsageError:
    return UsageError(f"metadata: {problem} (--metadata)")


def _payload_filter(text: str | None) -> str | None:
    """``--filter``, checked before any connection is made (refused naming the
    option, and the character at fault)."""
    if text is not None:
        check_text(text, "--filter")
        require_extra("filters")
    return check_filter(text, "--filter")
