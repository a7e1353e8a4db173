"""Standard Webhooks signatures for outgoing deliveries: pure, no I/O.

Each delivery carries ``webhook-id`` (the same on every retry), ``webhook-timestamp``
(integer seconds, fresh per attempt) and ``webhook-signature``: one ``v1,<base64>``
entry per active secret, so a receiver holding either the old or the new secret
accepts the request while a secret is being rotated.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence

from outbox.errors import InvalidMessage
from outbox.internal import check_key
from outbox.secrets import generate_secret, parse_secret, signature

__all__ = ["generate_secret", "parse_secret", "sign", "webhook_headers"]


def sign(secrets: Sequence[str], *, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,<base64>`` per secret, in order, space separated.

    Raises :class:`outbox.InvalidMessage`, naming the argument, for no secrets,
    a malformed secret, an unprintable ``msg_id``, a negative or non-integer
    ``timestamp`` or a ``body`` that is not bytes.
    """
    if isinstance(secrets, str | bytes) or not isinstance(secrets, Sequence):
        raise InvalidMessage("secrets", "must be a sequence of secrets, not a single value")
    if not secrets:
        raise InvalidMessage("secrets", "must hold at least one secret")
    keys = [parse_secret(secret, "secrets") for secret in secrets]
    check_key(msg_id, "msg_id")
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
        raise InvalidMessage("timestamp", "must be a non-negative integer (seconds)")
    if not isinstance(body, bytes):
        raise InvalidMessage("body", f"must be bytes, not {type(body).__name__}")
    stamp = str(timestamp)
    return " ".join(
        "v1," + base64.b64encode(signature(key, msg_id=msg_id, timestamp=stamp, body=body)).decode()
        for key in keys
    )


def webhook_headers(
    secrets: Sequence[str], *, msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three Standard Webhooks headers for one delivery attempt of ``body``."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secrets, msg_id=msg_id, timestamp=timestamp, body=body),
    }
