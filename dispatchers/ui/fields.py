"""What the dashboard reads from a query string, a form or a route.

Every field is checked here before anything runs: a value that cannot be meant
raises :class:`BadInput` naming the field, and the page answers 400 with that
message (:func:`dispatchers.ui.dashboard.bad`). Every text field goes through
:func:`read_text`, which refuses a NUL (PostgreSQL's text cannot hold one) and
text over a thousand characters; every time is checked to have a UTC instant
that Python and PostgreSQL can both hold, so no value from a request reaches a
statement or a template that cannot take it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from dispatchers.ui.policy_text import UNIT_SECONDS
from outbox.admin import NO_TENANT
from outbox.internal import MAX_ID, check_tenant_id

SPANS = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
"""The "since" choices of the dead-letter filters and of an endpoint's replay."""

MAX_CAP = 10_000
"""The largest cap an endpoint can be given here."""

_TEXT_LIMIT = 1000


class BadInput(ValueError):
    """A query or form field that cannot be meant; the page says which."""


def read_text(fields: Mapping[str, Any], name: str) -> str | None:
    """``name``, stripped, or None when absent or blank; at most
    :data:`_TEXT_LIMIT` characters and without NUL (PostgreSQL's text cannot
    hold one)."""
    value = fields.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    if len(value) > _TEXT_LIMIT:
        raise BadInput(f"{name}: longer than {_TEXT_LIMIT} characters")
    if "\x00" in value:
        raise BadInput(f"{name}: contains a NUL character")
    return value.strip()


def read_choice(fields: Mapping[str, Any], name: str, choices: tuple[str, ...]) -> str | None:
    """``name``: one of ``choices``, or None when absent."""
    value = read_text(fields, name)
    if value is not None and value not in choices:
        raise BadInput(f"{name}: must be one of {', '.join(choices)}")
    return value


def _in_range(name: str, moment: datetime, value: str) -> datetime:
    """``moment``, refused when its instant has no UTC time that Python can hold
    (a time in year 1 or 9999 with an offset that crosses the year's end), so
    that every page can show it in UTC."""
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise BadInput(f"{name}: {value[:40]!r} is out of range") from None
    return moment


def read_id(fields: Mapping[str, Any], name: str) -> int | None:
    value = read_text(fields, name)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_ID:
        raise BadInput(f"{name}: {value[:40]!r} is not an id")
    return int(value)


def read_ids(fields: MultiMapping[Any], name: str, *, most: int) -> list[int]:
    """Every ``name`` of a query string or form (a checkbox per id), each an id;
    at most ``most`` of them."""
    values = fields.getall(name, [])
    if len(values) > most:
        raise BadInput(f"{name}: more than {most} selected")
    ids = []
    for value in values:
        one = read_id({name: value}, name)
        if one is not None:
            ids.append(one)
    return sorted(set(ids))


def route_id(request: web.Request) -> int:
    """The message or endpoint id of the route: present, since the route matched."""
    value = read_id(request.match_info, "id")
    if value is None:
        raise BadInput("id: missing")
    return value


def read_tenant(
    fields: Mapping[str, Any], name: str = "tenant", *, or_none: bool = True
) -> str | None:
    """``name``: a tenant's external id, or None when absent; where ``or_none``,
    :data:`~outbox.admin.NO_TENANT` (``-``) too, for what belongs to no tenant."""
    value = read_text(fields, name)
    if value is None or (or_none and value == NO_TENANT):
        return value
    try:
        return check_tenant_id(value, name)
    except ValueError:
        also = f", or {NO_TENANT} for no tenant" if or_none else ""
        raise BadInput(
            f"{name}: {value[:40]!r} is not a tenant id (1-128 letters, digits and ._:@-, "
            f"starting with a letter or a digit{also})"
        ) from None


def read_since(fields: Mapping[str, Any]) -> datetime | None:
    """``since``: one of :data:`SPANS` ago, or an ISO 8601 time with an offset (as a
    confirmation page passes the instant it counted from)."""
    value = read_text(fields, "since")
    if value is None:
        return None
    if value in SPANS:
        return datetime.now(UTC) - SPANS[value]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(f"since: {value[:40]!r} is neither {', '.join(SPANS)} nor a time") from None
    if moment.utcoffset() is None:
        raise BadInput("since: the time has no UTC offset")
    return _in_range("since", moment, value)


def read_moment(fields: Mapping[str, Any], name: str) -> datetime | None:
    """A time as a browser's date-and-time field sends it, read as UTC (the
    dashboard shows every time in UTC), or with an offset of its own."""
    value = read_text(fields, name)
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(f"{name}: {value[:40]!r} is not a time (YYYY-MM-DDTHH:MM)") from None
    if moment.utcoffset() is None:
        return moment.replace(tzinfo=UTC)
    return _in_range(name, moment, value)


def read_webhook_id(fields: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """``webhook_id``, as a receiver logs it: the message's idempotency key,
    ``<event key>:<endpoint id>``; so the key and the endpoint to search."""
    value = read_text(fields, "webhook_id")
    if value is None:
        return None, None
    _, _, endpoint = value.rpartition(":")
    if not endpoint.isascii() or not endpoint.isdigit() or not 1 <= int(endpoint) <= MAX_ID:
        raise BadInput(f"webhook_id: {value[:40]!r} does not end in :<endpoint id>")
    return value, int(endpoint)


def read_cap(fields: Mapping[str, Any]) -> int | None:
    """``cap``: the most deliveries in flight at once, or None (empty) for no cap."""
    value = read_text(fields, "cap")
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_CAP:
        raise BadInput(f"cap: {value[:40]!r} is not a number from 1 to {MAX_CAP}")
    return int(value)


_SPAN = re.compile(r"(\d{1,9}(?:\.\d{1,3})?)([smhdw])")


def read_schedule(fields: Mapping[str, Any]) -> list[float] | None:
    """``retry_schedule``: the delays before each retry as the endpoint's page
    writes them (``5s,1m,90m``), or None (blank) for the dispatcher's back-off.
    How many and how long, :class:`outbox.endpoints.Endpoints` checks."""
    value = read_text(fields, "retry_schedule")
    if value is None:
        return None
    delays = []
    for part in value.split(","):
        match = _SPAN.fullmatch(part.strip())
        if match is None:
            raise BadInput(
                f"retry_schedule: {part.strip()[:40]!r} is not a span like 30s, 5m or 2h "
                "(comma-separated)"
            )
        delays.append(float(match[1]) * UNIT_SECONDS[match[2]])
    return delays


def read_rate(fields: Mapping[str, Any]) -> float | None:
    """``rate_limit``: deliveries a second (a positive number), or None (blank)."""
    value = read_text(fields, "rate_limit")
    if value is None:
        return None
    try:
        rate = float(value)
    except ValueError:
        raise BadInput(f"rate_limit: {value[:40]!r} is not a number") from None
    if not math.isfinite(rate) or rate <= 0:
        raise BadInput(f"rate_limit: {value[:40]!r} is not a positive number")
    return rate


def read_count(fields: Mapping[str, Any], name: str) -> int | None:
    """``name``: a whole number, or None (blank); its range the library checks."""
    value = read_text(fields, name)
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 9:
        raise BadInput(f"{name}: {value[:40]!r} is not a whole number")
    return int(value)
