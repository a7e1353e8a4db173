"""Bearer tokens of the management API: how one is made, stored and named (pure).

A token is :data:`PREFIX` followed by the base64url of 32 random bytes (256
bits from :mod:`secrets`). Only its SHA-256 is stored: a token of that entropy
cannot be found from its digest by trying, so it needs no salt nor a slow hash,
and a request's token is found by its digest in one index probe. The first
characters after the prefix are kept in clear (:func:`shown_prefix`) so that a
listing tells tokens apart without showing any of them.

A token's scope is ``read`` (GET routes) or ``write`` (every route); a token
made for a tenant is bound to that tenant whatever its scope.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from typing import Final, Literal

PREFIX: Final = "obx_"
"""How every token starts, so that a leaked one is recognised (secret scanners
match it)."""

TOKEN_BYTES: Final = 32
"""Random bytes in a token."""

SCOPES: Final = ("read", "write")
"""The scopes a token may have: ``write`` includes ``read``."""

Scope = Literal["read", "write"]

MAX_NAME = 200
"""The longest name a token may be given."""

_TOKEN = re.compile(r"^obx_[A-Za-z0-9_-]{43}\Z")


def new_token() -> str:
    """A new random token: :data:`PREFIX` and the base64url of :data:`TOKEN_BYTES`
    bytes, without padding (47 characters)."""
    raw = secrets.token_bytes(TOKEN_BYTES)
    return PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def is_token(text: str) -> bool:
    """Whether ``text`` has the form of a token (checked before it is hashed, so
    that anything else is refused without a database round trip)."""
    return _TOKEN.match(text) is not None


def token_digest(token: str) -> bytes:
    """What is stored of ``token``: its SHA-256."""
    return hashlib.sha256(token.encode("ascii")).digest()


def shown_prefix(token: str) -> str:
    """The part of ``token`` a listing shows: the prefix and 4 characters (24
    of its 256 bits: enough to tell tokens apart, far too few to guess it)."""
    return token[: len(PREFIX) + 4]


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header, or None if the
    header is absent or of another scheme. The scheme is case-insensitive
    (RFC 9110)."""
    if header is None:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    value = value.strip()
    return value or None


@dataclass(frozen=True)
class Principal:
    """Who makes a request: the token's id, name and scope, and its tenant
    (the row id and the external id), None for an operator's token."""

    token_id: int
    name: str
    scope: Scope
    tenant_id: int | None = None
    tenant: str | None = None

    @property
    def can_write(self) -> bool:
        return self.scope == "write"

    @property
    def operator(self) -> bool:
        """Whether the token is the operator's (bound to no tenant)."""
        return self.tenant_id is None

    @property
    def label(self) -> str:
        """How the log and the audit name it: ``token:ID`` and its name."""
        return f"token:{self.token_id}" + (f" ({self.name})" if self.name else "")
