"""What makes two requests the same: the digest stored with an idempotency key.

A key promises one remote effect. Enqueuing a key again is a retry only if it asks
for the same request; otherwise the second request would be silently dropped (the
IETF Idempotency-Key draft and Stripe both refuse a reused key whose request
differs). So each key is stored with a SHA-256 digest of its request, computed
here (no database CPU), and a later enqueue of the key compares digests.

The digest covers what is sent and so decides the remote effect: the method, the
URL, the headers, the content type and the body. It leaves out what only decides
*when* or *how often* the request is tried (``ordering_key``, ``available_at``,
``max_attempts``): a retry that computes another schedule is still the same
request, and must get the first message's id rather than an error.

The encoding is unambiguous: a tag naming it and its version, then every field as
its length (8 bytes, big-endian) followed by its bytes (text as UTF-8), in a fixed
order. The headers come last: their count (8 bytes), then each name (lower-cased,
as HTTP compares names) and value as fields, sorted by name (validation refuses a
name given twice in any case). No two different requests encode alike, whatever
bytes their fields hold. An event's digest covers its type and its payload as
encoded in the body (``data``); the envelope's timestamp changes on every call
and is left out.

Changing the encoding changes every digest, so that a key stored before would
refuse its own retry: a new encoding needs a new tag and a migration.
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
