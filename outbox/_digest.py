"""What makes two requests the same: the digest stored with an idempotency key.

The SHA-256 covers method, URL, headers, content type and body (an event: its
type and ``data``), never the schedule (``ordering_key``, ``available_at``,
``max_attempts``). Fields are length-prefixed in a fixed order, headers last,
lower-cased and sorted, so no two requests encode alike. Changing the encoding
changes every stored digest: it needs a new tag and a migration.

Design: docs/explanation/design/idempotency-digest.md
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

_REQUEST = b"outbox.request.v1"
_EVENT = b"outbox.event.v1"


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def request_digest(
    *, method: str, url: str, headers: Mapping[str, str], content_type: str, body: bytes
) -> bytes:
    """The digest of an HTTP request as :meth:`outbox.Outbox.enqueue` stores it."""
    digest = hashlib.sha256(_REQUEST)
    for text in (method, url, content_type):
        digest.update(_field(text.encode()))
    digest.update(_field(body))
    named = sorted((name.lower(), value) for name, value in headers.items())
    digest.update(len(named).to_bytes(8, "big"))
    for name, value in named:
        digest.update(_field(name.encode()))
        digest.update(_field(value.encode()))
    return digest.digest()


def event_digest(*, event_type: str, payload: bytes) -> bytes:
    """The digest of an event as :meth:`outbox.Outbox.publish` stores it: its
    type and its JSON-encoded payload."""
    digest = hashlib.sha256(_EVENT)
    digest.update(_field(event_type.encode()))
    digest.update(_field(payload))
    return digest.digest()
