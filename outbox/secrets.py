"""Standard Webhooks secrets and the signature they make: pure, no I/O.

A secret is ``whsec_`` followed by the standard base64 of 24 to 64 random bytes;
those bytes are the HMAC-SHA256 key. The sender (``dispatchers.delivery.signing``), the
endpoints API and the receiver (``outbox.receiver``) all validate secrets and
compute signatures here, so both ends share one implementation.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from typing import cast

from outbox.errors import InvalidMessage

SECRET_PREFIX = "whsec_"  # noqa: S105 - a format prefix, not a secret
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64
GENERATED_KEY_BYTES = 32

_BASE64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}\Z")


def generate_secret() -> str:
    """A new random secret: ``whsec_`` + base64 of 32 bytes from :mod:`secrets`."""
    key = secrets.token_bytes(GENERATED_KEY_BYTES)
    return SECRET_PREFIX + base64.b64encode(key).decode("ascii")


def parse_secret(secret: object, field: str = "secret") -> bytes:
    """The HMAC key of ``secret``; raise :class:`InvalidMessage` naming ``field``.

    Missing base64 padding is tolerated (some providers strip it); anything else
    outside the standard base64 alphabet is rejected. The message never
    includes the secret itself.
    """
    if not isinstance(secret, str):
        raise InvalidMessage(field, f"must be a string, not {type(secret).__name__}")
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidMessage(field, f"must start with {SECRET_PREFIX!r}")
    encoded = secret[len(SECRET_PREFIX) :]
    if not _BASE64.match(encoded):
        raise InvalidMessage(field, "is not valid base64 after the prefix")
    encoded = encoded.rstrip("=")
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        raise InvalidMessage(field, "is not valid base64 after the prefix") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise InvalidMessage(
            field, f"must encode {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, not {len(key)}"
        )
    return key


def check_secret(secret: object, field: str = "secret") -> str:
    """Return ``secret`` unchanged if :func:`parse_secret` accepts it."""
    parse_secret(secret, field)
    return cast(str, secret)


def fingerprint(secret: str) -> str:
    """How a secret is shown when it is not shown in full: a hash prefix that tells
    secrets apart and reveals none of the key's bytes (unlike a prefix of the
    secret itself)."""
    return SECRET_PREFIX + "…" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def signature(key: bytes, *, msg_id: str, timestamp: str, body: bytes) -> bytes:
    """The raw HMAC-SHA256 of ``{msg_id}.{timestamp}.{body}`` under ``key``."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    return hmac.new(key, content, hashlib.sha256).digest()
