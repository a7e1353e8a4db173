"""Who may use a portal page, and which pages may frame it (pure).

- The token in a link's path is its holder's only credential: the portal sets no
  cookie, so it works the same inside another site's frame, where browsers
  withhold third-party cookies. Each request's token is looked up (as its
  SHA-256 digest, :func:`outbox.portal.find_link`) before any handler runs.
- Every form of a page carries :func:`csrf_token`: an HMAC of a fixed label
  keyed by the link's token, compared in constant time when the form is posted.
  A page of another origin cannot read it (it would need the token, and the
  page), so it cannot post a form that a portal page did not make.
- The frame-ancestors sources (:func:`frame_ancestors`) say which sites may show
  the portal in a frame: ``'none'`` by default, as for every dashboard page.
  Each is checked to be one source, so none can add a directive to the policy.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable

_CSRF_LABEL = b"outbox.portal.csrf.v1"

NONE = "'none'"
SELF = "'self'"

_SOURCE = re.compile(
    r"https?://(\*\.)?[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}[A-Za-z0-9])?)*(?::(?:[0-9]{1,5}|\*))?"
)


def csrf_token(token: str) -> str:
    """The CSRF field of the forms of the link with ``token``."""
    return hmac.new(token.encode("ascii"), _CSRF_LABEL, hashlib.sha256).hexdigest()


def accepts_csrf(token: str, given: str | None) -> bool:
    """Whether ``given`` is the CSRF field of ``token``'s forms (constant time)."""
    if given is None:
        return False
    expected = csrf_token(token).encode("ascii")
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)


def frame_ancestors(sources: Iterable[str]) -> tuple[str, ...]:
    """The sites that may frame the portal, checked: ``'none'`` alone, or any of
    ``'self'`` and origins such as ``https://app.example.com``,
    ``https://*.example.com`` or ``http://localhost:3000`` (no path). Raises
    ValueError naming the source that is not one."""
    checked = []
    for source in sources:
        text = source.strip()
        if text.lower() in (NONE, "none"):
            text = NONE
        elif text.lower() in (SELF, "self"):
            text = SELF
        elif not _SOURCE.fullmatch(text):
            raise ValueError(
                f"{source[:80]!r} is not 'self', 'none' or an origin such as "
                "https://app.example.com (a scheme, a host, an optional port, no path)"
            )
        if text not in checked:
            checked.append(text)
    if not checked:
        return (NONE,)
    if NONE in checked and len(checked) > 1:
        raise ValueError("'none' cannot be given with other sources")
    return tuple(checked)


def policy(dashboard_policy: str, ancestors: tuple[str, ...]) -> str:
    """The dashboard's Content-Security-Policy with its frame-ancestors directive
    replaced by ``ancestors`` (checked by :func:`frame_ancestors`)."""
    directive = "frame-ancestors " + " ".join(ancestors)
    directives = dashboard_policy.split("; ")
    if not any(d.startswith("frame-ancestors") for d in directives):
        return "; ".join([*directives, directive])
    return "; ".join(directive if d.startswith("frame-ancestors") else d for d in directives)


def frame_options(ancestors: tuple[str, ...]) -> str | None:
    """The X-Frame-Options header that agrees with ``ancestors``, for browsers
    that do not read frame-ancestors: DENY, SAMEORIGIN, or none where other
    sites may frame the portal (the header cannot name them)."""
    if ancestors == (NONE,):
        return "DENY"
    if ancestors == (SELF,):
        return "SAMEORIGIN"
    return None
