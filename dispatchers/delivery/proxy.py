"""The forward proxy every delivery goes through, when one is configured.

https destinations go through a ``CONNECT`` tunnel, http ones in absolute form.
Credentials are parsed out of the URL at once and masked wherever :class:`Proxy`
shows itself. Whatever either client would refuse is refused when the URL is
parsed. The SSRF guard still applies to the destination, never to the proxy.

Design: docs/explanation/design/proxy.md
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes, urlsplit

from outbox.errors import ConfigurationError, InvalidMessage
from outbox.internal import check_url

__all__ = ["Proxy"]

_MASK = "***"
_PRINTABLE = re.compile(rb"[\x20-\x7e]*")


@dataclass(frozen=True)
class Proxy:
    """A forward proxy: where it is, and the credentials it asks for (if any).

    Make one with :meth:`parse`; ``str()`` and ``repr()`` mask the credentials.
    """

    url: str
    """``http://host:port``, without credentials."""
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, text: str) -> Proxy:
        """The proxy ``text`` names; raise ``ConfigurationError`` (with the
        credentials masked) unless it is ``http://[user[:password]@]host[:port]``
        with nothing after the port but an optional ``/``."""
        if not isinstance(text, str):
            raise ConfigurationError(f"proxy: must be a URL, not {type(text).__name__}")
        shown = _masked(text.strip())
        try:
            parts = urlsplit(text.strip())
        except ValueError:
            raise ConfigurationError(f"proxy: {shown} is not a valid URL") from None
        try:
            port = parts.port
        except ValueError:
            raise ConfigurationError(f"proxy: {shown} has an invalid port") from None
        if parts.scheme != "http":
            raise ConfigurationError(
                f"proxy: {shown} must be an http:// URL (https destinations go through "
                "it in a CONNECT tunnel, so TLS still runs end to end)"
            )
        host = parts.hostname
        if not host:
            raise ConfigurationError(f"proxy: {shown} names no host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigurationError(f"proxy: {shown} must have no path, query or fragment")
        netloc = f"[{host}]" if ":" in host else host
        url = f"http://{netloc}:{80 if port is None else port}"
        try:
            check_url(url, "proxy")
        except InvalidMessage as exc:
            raise ConfigurationError(f"proxy: {shown}: {exc.problem}") from None
        if parts.username is None:
            return cls(url)
        username = _decoded(parts.username, "user name", shown)
        if ":" in username:
            raise ConfigurationError(
                f"proxy: {shown} has a ':' in its user name (percent-encoded or not): "
                "Basic authentication cannot carry one"
            )
        return cls(url, username, _decoded(parts.password or "", "password", shown))

    @property
    def credentials(self) -> tuple[str, str] | None:
        """The user name and password the proxy is given, if any."""
        if self.username is None:
            return None
        return self.username, self.password or ""

    def __str__(self) -> str:
        if self.username is None:
            return self.url
        return self.url.replace("://", f"://{_MASK}@", 1)


def _decoded(text: str, part: str, shown: str) -> str:
    """``text`` percent-decoded, if it is printable ASCII; else a
    :class:`ConfigurationError` naming ``part`` of the URL ``shown``."""
    raw = unquote_to_bytes(text)
    if not _PRINTABLE.fullmatch(raw):
        raise ConfigurationError(
            f"proxy: {shown} has a {part} that is not printable ASCII once percent-decoded"
        )
    return raw.decode("ascii")


def _masked(text: str) -> str:
    """``text`` with whatever sits between ``://`` and the last ``@`` of its
    authority masked, so that an error about a malformed URL never shows it."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return repr(_MASK) if "@" in text else repr(text)
    authority_end = len(rest)
    for mark in "/?#":
        position = rest.find(mark)
        if position != -1:
            authority_end = min(authority_end, position)
    authority = rest[:authority_end]
    if "@" in authority:
        authority = _MASK + authority[authority.rfind("@") :]
    return repr(f"{scheme}://{authority}{rest[authority_end:]}")
