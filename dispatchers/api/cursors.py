"""Opaque page cursors (pure).

A list answers a page of rows and, when more may follow, a cursor naming where
the next page starts. Clients pass it back as it is: its form (base64url of a
small JSON object holding the last key read, an id or a tenant's external id,
and the list it belongs to, then ``.`` and the base64url of its HMAC-SHA256
under the database's cursor key, cut to :data:`TAG_BYTES`) is this module's to
change. The key is the caller's to give (the API reads it from the database's
``api_cursor_key``), so a cursor works on every process serving that database,
across restarts. A cursor of another list, one altered, or one not made with
the key given (on another database) is refused as a bad ``cursor`` field, never
an error of the server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json

from outbox.internal import MAX_ID

DEFAULT_LIMIT = 50
"""Rows of a page when ``limit`` is not given."""

MAX_LIMIT = 200
"""The most rows a page may ask for."""

MAX_CURSOR = 300
"""The longest cursor accepted (one naming a tenant of the longest external id
is about 230 characters)."""

TAG_BYTES = 16
"""The bytes of the signature a cursor carries (128 bits: not found by trying)."""


class BadCursor(ValueError):
    """A cursor that was not made by this API for this list."""


def encode(kind: str, last: int | str, *, key: bytes) -> str:
    """The cursor of list ``kind`` whose next page follows row ``last``, signed
    with ``key``."""
    text = json.dumps({"k": kind, "id": last}, separators=(",", ":")).encode()
    return _made(text, key)


def decode(kind: str, cursor: str, *, key: bytes) -> int:
    """The row id of a cursor made by :func:`encode` for list ``kind`` with
    ``key``; raises :class:`BadCursor` for anything else."""
    last = _last(kind, cursor, key)
    if isinstance(last, bool) or not isinstance(last, int) or not 0 <= last <= MAX_ID:
        raise BadCursor("is not a cursor this API made")
    return last


def decode_text(kind: str, cursor: str, *, key: bytes) -> str:
    """The text key (a tenant's external id) of a cursor made by :func:`encode`
    for list ``kind`` with ``key``; raises :class:`BadCursor` for anything else."""
    last = _last(kind, cursor, key)
    if not isinstance(last, str) or not last.isprintable() or not 0 < len(last) <= 128:
        raise BadCursor("is not a cursor this API made")
    return last


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _made(text: bytes, key: bytes) -> str:
    tag = hmac.new(key, text, hashlib.sha256).digest()[:TAG_BYTES]
    return f"{_b64(text)}.{_b64(tag)}"


def _last(kind: str, cursor: str, key: bytes) -> object:
    if len(cursor) > MAX_CURSOR:
        raise BadCursor("is longer than any cursor this API makes")
    body = cursor.partition(".")[0]
    try:
        text = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise BadCursor("is not a cursor this API made") from None
    # the whole cursor as this key makes it: base64 decoding skips characters
    # outside its alphabet, so a decoded signature would pass cursors altered so
    if not hmac.compare_digest(cursor.encode(), _made(text, key).encode()):
        raise BadCursor("was altered, or made for another database")
    value = json.loads(text)
    if not isinstance(value, dict) or set(value) != {"k", "id"}:
        raise BadCursor("is not a cursor this API made")
    if value["k"] != kind:
        raise BadCursor("belongs to another list")
    return value["id"]
