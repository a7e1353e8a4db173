"""How delivery policies read to an operator: spans, retry schedules, rate limits,
TLS material and credentials, worded once for the commands and for the dashboard (which may
not import the commands)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from outbox.internal import pem_digest

if TYPE_CHECKING:
    from outbox.endpoints import Endpoint

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
"""The seconds of each unit a span is written in."""


def format_duration(seconds: float) -> str:
    """A span the commands read back as ``seconds``, in the largest unit up to
    days that divides it (``604800`` is ``7d``, ``5400`` is ``90m``)."""
    for unit in "dhm":
        size = UNIT_SECONDS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def format_schedule(delays: Sequence[float] | None) -> str | None:
    """A retry schedule as ``--retry-schedule`` reads it (None stays None)."""
    return None if delays is None else ",".join(map(format_duration, delays))


def rate_text(rate: float | None, burst: int | None) -> str | None:
    """A rate limit with its burst (None: none)."""
    return None if rate is None else f"{rate:g}/s, burst {burst}"


def tls_fields(ep: Endpoint) -> list[tuple[str, object]]:
    """An endpoint's TLS material as an operator may see it: the digests of its
    certificates, and how its key is stored; never the PEM text or the key."""
    key = None
    if ep.client_key is not None:
        sealed_by = ep.client_key.key_id
        key = f"sealed under key {sealed_by}" if sealed_by else "stored in plain text"
    bundle, cert = pem_digest(ep.ca_bundle), pem_digest(ep.client_cert)
    return [
        ("CA bundle", bundle and f"sha256 {bundle}"),
        ("client cert", cert and f"sha256 {cert}"),
        ("client key", key),
    ]


def auth_fields(ep: Endpoint) -> list[tuple[str, object]]:
    """An endpoint's credentials as an operator may see them: the names of its
    static headers, what sets ``Authorization`` (the basic user, the OAuth2
    client), and how they are stored; never a value, password, token or secret."""
    if ep.auth is None:
        return [("credentials", None)]
    sealed_by = ep.auth.key_id
    stored = f"sealed under key {sealed_by}" if sealed_by else "stored in plain text"
    scheme = None
    if ep.auth_scheme == "basic":
        scheme = f"basic, user {ep.basic_username}"
    elif ep.auth_scheme == "bearer":
        scheme = "bearer token"
    elif ep.auth_scheme == "oauth2":
        extra = "".join(
            f", {name} {value}"
            for name, value in (("scope", ep.oauth2_scope), ("audience", ep.oauth2_audience))
            if value is not None
        )
        scheme = (
            f"OAuth2 client credentials, client {ep.oauth2_client_id} "
            f"at {ep.oauth2_token_url}{extra}"
        )
    return [
        ("headers", ", ".join(ep.header_names) or None),
        ("authorization", scheme),
        ("credentials", stored),
    ]
