"""Opaque page cursors (pure).

A list answers a page of rows and, when more may follow, a cursor naming where
the next page starts. Clients pass it back as it is: its form (base64url of a
small JSON object holding the last key read, an id or a tenant's external id,
and the list it belongs to) is
this module's to change. A cursor of another list, or one altered, is refused
as a bad ``cursor`` field, never an error of the server.
"""

from __future__ import annotations

import base64
import binascii
import json

from outbox.internal import MAX_ID

DEFAULT_LIMIT = 50
"""Rows of a page when ``limit`` is not given."""

MAX_LIMIT = 200
"""The most rows a page may ask for."""

MAX_CURSOR = 200
"""The longest cursor accepted (those made here are far shorter)."""


class BadCursor(ValueError):
    """A cursor that was not made by this API for this list."""


def encode(kind: str, key: int | str) -> str:
    """The cursor of list ``kind`` whose next page follows row ``key``."""
    text = json.dumps({"k": kind, "id": key}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode("ascii")


def decode(kind: str, cursor: str) -> int:
    """The row id of a cursor made by :func:`encode` for list ``kind``; raises
    :class:`BadCursor` for anything else."""
    key = _key(kind, cursor)
    if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= MAX_ID:
        raise BadCursor("is not a cursor this API made")
    return key


def decode_text(kind: str, cursor: str) -> str:
    """The text key (a tenant's external id) of a cursor made by :func:`encode`
    for list ``kind``; raises :class:`BadCursor` for anything else."""
    key = _key(kind, cursor)
    if not isinstance(key, str) or not key.isprintable() or not 0 < len(key) <= 128:
        raise BadCursor("is not a cursor this API made")
    return key


def _key(kind: str, cursor: str) -> object:
    if len(cursor) > MAX_CURSOR:
        raise BadCursor("is longer than any cursor this API makes")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        raise BadCursor("is not a cursor this API made") from None
    if not isinstance(value, dict) or set(value) != {"k", "id"}:
        raise BadCursor("is not a cursor this API made")
    if value["k"] != kind:
        raise BadCursor("belongs to another list")
    return value["id"]
