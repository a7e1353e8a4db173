"""Credentials taken out of what a receiver answers, before it is recorded: pure, no I/O.

An attempt's response excerpt, and an error text quoting the response, are shown by
the API, the portal and the dashboard, and a receiver may echo its request.
:class:`Sent` finds the credentials of one request in its headers (``Authorization``,
``Proxy-Authorization``, ``Cookie``, the endpoint's own headers, any header named like
a credential, the webhook signatures) and :meth:`Sent.redact` replaces each, as sent
(after its auth scheme; a Basic password decoded), JSON-escaped (also with ``\\/``),
percent-encoded or HTML-escaped, by :data:`MARKER`: longest first, and in a text cut
short, a tail that begins one. Values shorter than :data:`MIN_LENGTH` are left: their
marker would mangle the text and show them.
"""

from __future__ import annotations

import base64
import binascii
import functools
import html
import json
import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote

__all__ = ["MARKER", "MIN_LENGTH", "Sent", "forms"]

MARKER = "[redacted]"
"""What replaces a credential in a recorded text."""

MIN_LENGTH = 4
"""Shortest value (or cut-off start of one) that is looked for."""

SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})
"""Headers whose values are credentials whoever set them."""

SCHEMED = frozenset({"authorization", "proxy-authorization"})
"""Headers whose value is an auth scheme, a space and the credentials."""

SIGNATURE_HEADER = "webhook-signature"
"""One ``v1,<base64>`` signature per secret, space separated."""

NOT_SECRET = frozenset({"idempotency-key"})
"""A header the outbox sets that is named like a credential, and shown anyway."""

_CREDENTIAL_NAME = re.compile(
    r"auth|token|secret|passw|key|signature|session|cookie|credential", re.IGNORECASE
)
"""A message's own header named like a credential (``X-Api-Key``, ``X-Auth-Token``)."""

_PLAIN = re.compile(r"[A-Za-z0-9._~+/=-]*")
"""Characters (those of base64 and of a token) that JSON and HTML leave as they are,
and of which percent-encoding changes only ``+/=``."""


@functools.lru_cache(maxsize=1024)
def forms(value: str, schemed: bool = False) -> tuple[str, ...]:
    """The forms of credential ``value`` worth looking for (see the module's docstring),
    each at least :data:`MIN_LENGTH` long; ``schemed``: the value of an
    ``Authorization`` header. Cached: an endpoint sends the same values many times."""
    return _forms(value, schemed)


def _forms(value: str, schemed: bool = False) -> tuple[str, ...]:
    bases = {value}
    scheme, space, credentials = value.partition(" ")
    credentials = credentials.strip()
    if schemed and space and len(credentials) >= MIN_LENGTH:
        bases = {credentials}  # the scheme is no secret: "Bearer [redacted]"
        if scheme.lower() == "basic":
            try:
                pair = base64.b64decode(credentials, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                pair = ""
            _user, colon, password = pair.partition(":")
            if colon:  # the password alone ("alice:[redacted]"), or with the user
                bases.add(password if len(password) >= MIN_LENGTH else pair)
    found: set[str] = set()
    for base in bases:
        found.update(_escaped(base))
    return tuple(f for f in found if len(f) >= MIN_LENGTH)


def _escaped(base: str) -> Iterable[str]:
    """``base``, escaped for JSON (also with ``\\/``), percent-encoded, HTML-escaped."""
    if _PLAIN.fullmatch(base):  # the common case, made cheaply
        yield base
        if "/" in base:
            yield base.replace("/", "\\/")
        yield base.replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")
        return
    escaped = json.dumps(base)[1:-1]
    yield from (base, escaped, escaped.replace("/", "\\/"), quote(base, safe=""), html.escape(base))


def _signatures(value: str) -> Iterable[str]:
    """The forms of the base64 of each entry (``v1,<base64>``) of a
    ``webhook-signature`` value (uncached: an attempt's signatures are its own)."""
    for entry in value.split():
        signature = entry.partition(",")[2]  # base64, as the outbox made it
        yield signature
        yield signature.replace("/", "\\/")
        yield signature.replace("+", "%2B").replace("/", "%2F").replace("=", "%3D")


_OTHER, _SECRET, _SCHEMED, _SIGNATURE = range(4)


@functools.lru_cache(maxsize=1024)
def _kind(name: str) -> int:
    """What a header of ``name`` holds, whoever set it: a credential (plain or
    after an auth scheme), signatures, or nothing secret (by its name)."""
    lower = name.lower()
    if lower == SIGNATURE_HEADER:
        return _SIGNATURE
    if lower in SCHEMED:
        return _SCHEMED
    if lower in SECRET_HEADERS:
        return _SECRET
    if lower not in NOT_SECRET and _CREDENTIAL_NAME.search(lower) is not None:
        return _SECRET
    return _OTHER


class Sent:
    """The credentials of one request, found in its headers on first use.

    :param headers: the headers sent.
    :param own: the names of the endpoint's own headers (all of them credentials).
    :param extra: other secrets sent, as headers (name, value): a proxy's
        ``Proxy-Authorization``, a token request's ``Authorization``.
    """

    __slots__ = ("_extra", "_headers", "_needles", "_own")

    def __init__(
        self,
        headers: Mapping[str, str],
        *,
        own: Iterable[str] = (),
        extra: Iterable[tuple[str, str]] = (),
    ) -> None:
        self._headers = headers
        self._own = own
        self._extra = extra
        self._needles: tuple[str, ...] | None = None

    def needles(self) -> tuple[str, ...]:
        """Every form to replace, longest first."""
        if self._needles is None:
            own = {name.lower() for name in self._own} if self._own else None
            found: set[str] = set()
            for name, value in (*self._headers.items(), *self._extra):
                kind = _kind(name)
                if kind == _SIGNATURE:
                    found.update(_signatures(value))
                elif kind != _OTHER:
                    found.update(forms(value, kind == _SCHEMED))
                elif own is not None and name.lower() in own:
                    found.update(forms(value, False))
            self._needles = tuple(sorted(found, key=len, reverse=True))
        return self._needles

    def redact(self, text: str, *, cut: bool = False) -> str:
        """``text`` with every credential replaced by :data:`MARKER`; ``cut``: the
        text was cut short, so a tail that begins a credential is replaced too."""
        if len(text) < MIN_LENGTH:
            return text
        needles = self.needles()
        for needle in needles:
            if needle in text:
                text = text.replace(needle, MARKER)
        if cut:
            start = min((_cut_start(text, n) for n in needles), default=len(text))
            if start < len(text):
                text = text[:start] + MARKER
        return text

    def redact_error(self, error: str | None, *, limit: int) -> str | None:
        """An error text of at most ``limit`` characters, redacted: one that fills
        the limit and ends ``...`` was cut short, and is cut again to stay within it."""
        if error is None:
            return None
        cut = len(error) >= limit and error.endswith("...")
        text = self.redact(error[:-3] if cut else error, cut=cut)
        if cut or len(text) > limit:
            text = text[: limit - 3] + "..."
        return text


def _cut_start(text: str, needle: str) -> int:
    """Where the longest tail of ``text`` that begins ``needle`` (at least
    :data:`MIN_LENGTH` characters, not all of it) starts; ``len(text)`` if none."""
    end = len(text)
    index = text.find(needle[0], max(0, end - len(needle) + 1), end - MIN_LENGTH + 1)
    while index != -1:
        if needle.startswith(text[index:]):
            return index
        index = text.find(needle[0], index + 1, end - MIN_LENGTH + 1)
    return end
