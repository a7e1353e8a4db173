"""OAuth2 access tokens for endpoints that want them (client credentials, RFC 6749 §4.4).

:class:`Tokens` fetches a token through the sender's own client (SSRF guard, proxy,
bounded read apply) with ``client_secret_basic``, and caches it per process, keyed
by the endpoint and a digest of its credentials, until shortly before it expires.
One fetch per key at a time; a failure is shared for :data:`FAILURE_HOLD`. A 401
drops the token only if it is still the one cached. :meth:`Tokens.aclose` waits
for the fetches it cancels at most :data:`CLOSE_WITHIN`. No ``repr``, error or log
line shows a secret or a token; a token that cannot be had is a :class:`TokenUnavailable`.

Design: docs/explanation/design/oauth2.md
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus, urlencode, urlsplit, urlunsplit

from dispatchers.delivery.auth import ClientCredentials
from dispatchers.delivery.outcome import MAX_ERROR_LENGTH, Outcome, Verdict, classify_exception

if TYPE_CHECKING:
    from dispatchers.delivery.client import HttpClient

__all__ = [
    "CLOSE_WITHIN",
    "DEFAULT_LIFETIME",
    "FAILURE_HOLD",
    "MARGIN",
    "RESPONSE_LIMIT",
    "TokenUnavailable",
    "Tokens",
    "basic_authorization",
    "fingerprint",
    "refresh_after",
]

DEFAULT_LIFETIME = 300.0
"""Seconds a token is taken to last when its response has no ``expires_in``."""

MARGIN = 30.0
"""Seconds before its expiry that a token is replaced, at most (a tenth of its
lifetime when that is less: a 60 s token is used for 54 s)."""

FAILURE_HOLD = 5.0
"""Seconds a failed fetch answers for its key before the token endpoint is asked
again."""

CLOSE_WITHIN = 5.0
"""Seconds :meth:`Tokens.aclose` waits for the fetches it cancelled to end; one
that has not by then is left behind, with a warning."""

RESPONSE_LIMIT = 64 * 1024
"""Most bytes of a token response read; a longer one is refused."""

ERROR_CLASS = "oauth2"
"""The ``error_class`` of an attempt that could not get its token."""

_OAUTH_ERROR = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
"""An OAuth ``error`` code worth repeating (the registered ones are ``a_b`` words)."""

_TOKEN = re.compile(r"[\x21-\x7e]+")
"""A token that fits in a header: visible ASCII, nothing to split or inject."""

Key = tuple[int | None, str]

_log = logging.getLogger(__name__)


class TokenUnavailable(Exception):
    """No token could be had: its reason (free of secrets) and the attempt's outcome.

    Never leaves the sender, which makes the outcome the attempt's (so it is not
    in :mod:`outbox.errors`'s tree).
    """

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


def fingerprint(credentials: ClientCredentials) -> str:
    """A SHA-256 of every field of ``credentials``: equal for equal credentials,
    and the only form in which the cache keeps them."""
    fields = (
        credentials.token_url,
        credentials.client_id,
        credentials.client_secret,
        credentials.scope,
        credentials.audience,
    )
    text = json.dumps(fields, ensure_ascii=True)  # unambiguous, None apart from ""
    return hashlib.sha256(text.encode()).hexdigest()


def basic_authorization(client_id: str, client_secret: str) -> str:
    """The ``Authorization`` value of ``client_secret_basic``: id and secret
    form-urlencoded (RFC 6749 §2.3.1, Appendix B), joined by ``:``, base64."""
    pair = f"{quote_plus(client_id, safe='')}:{quote_plus(client_secret, safe='')}"
    return "Basic " + base64.b64encode(pair.encode("ascii")).decode("ascii")


def refresh_after(lifetime: float) -> float:
    """Seconds after its request that a token of ``lifetime`` seconds is replaced."""
    return lifetime - min(MARGIN, lifetime / 10)


def shown(url: str) -> str:
    """``url`` as errors show it: without user info, query or fragment, bounded."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        text = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        text = "(invalid URL)"
    return text if len(text) <= 200 else text[:197] + "..."


@dataclass(slots=True)
class _Entry:
    """One key's token, its refresh time, the fetch under way, the last failure."""

    token: str | None = None
    refresh_at: float = 0.0
    fetch: asyncio.Task[None] | None = None
    failure: Outcome | None = None
    failed_until: float = 0.0


class Tokens:
    """The access tokens of this process's endpoints (see the module's docstring).

    :param client: sends the token requests (the sender's: guarded, proxied).
    :param timeout: seconds a token request may take, from connect to last byte.
    :param user_agent: its ``User-Agent``.
    :param clock: seconds, monotonic (default :func:`time.monotonic`).
    """

    def __init__(
        self,
        client: HttpClient,
        *,
        timeout: float,
        user_agent: str = "outbox-dispatcher",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._user_agent = user_agent
        self._clock = clock
        self._entries: dict[Key, _Entry] = {}
        self.fetches = 0
        """Token requests sent so far."""

    def __len__(self) -> int:
        """How many keys have an entry."""
        return len(self._entries)

    async def token(self, endpoint_id: int | None, credentials: ClientCredentials) -> str:
        """The token to send to ``endpoint_id``: the cached one, or one fetched now
        (or being fetched). Raises :class:`TokenUnavailable`."""
        key = (endpoint_id, fingerprint(credentials))
        entry = self._entries.get(key)
        if entry is None:
            # changed credentials replace the endpoint's old entry
            for old in [k for k in self._entries if k[0] == endpoint_id]:
                del self._entries[old]
            entry = self._entries[key] = _Entry()
        now = self._clock()
        if entry.token is not None and now < entry.refresh_at:
            return entry.token
        if entry.fetch is None:
            if entry.failure is not None and now < entry.failed_until:
                raise TokenUnavailable(entry.failure)
            entry.fetch = asyncio.create_task(self._fetch(entry, credentials))
        # shielded: a caller giving up (its deadline) leaves the fetch to the others
        await asyncio.shield(entry.fetch)
        if entry.token is not None:
            return entry.token
        if entry.failure is not None:
            raise TokenUnavailable(entry.failure)
        # invalidated between the fetch and this caller's turn: fetch again
        return await self.token(endpoint_id, credentials)

    def invalidate(
        self, endpoint_id: int | None, credentials: ClientCredentials, token: str
    ) -> None:
        """Forget ``token`` (a receiver refused it) if it is still the cached one."""
        entry = self._entries.get((endpoint_id, fingerprint(credentials)))
        if entry is not None and entry.token == token:
            entry.token = None

    async def aclose(self, *, within: float = CLOSE_WITHIN) -> None:
        """Cancel the fetches under way and wait for them, at most ``within`` seconds."""
        tasks = {e.fetch for e in self._entries.values() if e.fetch is not None}
        self._entries.clear()
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=within)
        if pending:
            _log.warning(
                "%d OAuth2 token request(s) still running %g s after they were cancelled: "
                "left behind",
                len(pending),
                within,
            )

    async def _fetch(self, entry: _Entry, credentials: ClientCredentials) -> None:
        """Fetch a token into ``entry``, or note why not."""
        sent_at = self._clock()
        try:
            token, lifetime = await self._request(credentials)
        except Exception as exc:  # even our own error is a failure: never a loop of fetches
            entry.token = None
            entry.failure = (
                exc.outcome
                if isinstance(exc, TokenUnavailable)
                else _failed_request(credentials.token_url, exc)
            )
            entry.failed_until = self._clock() + FAILURE_HOLD
        else:
            entry.token = token
            entry.refresh_at = sent_at + refresh_after(lifetime)
            entry.failure = None
        finally:
            entry.fetch = None

    async def _request(self, credentials: ClientCredentials) -> tuple[str, float]:
        """Ask the token endpoint: the token and its lifetime in seconds."""
        url = credentials.token_url
        form = {"grant_type": "client_credentials"}
        if credentials.scope is not None:
            form["scope"] = credentials.scope
        if credentials.audience is not None:
            form["audience"] = credentials.audience
        headers = {
            "Authorization": basic_authorization(credentials.client_id, credentials.client_secret),
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
            "Accept-Encoding": "identity",
            "User-Agent": self._user_agent,
        }
        self.fetches += 1
        try:
            async with asyncio.timeout(self._timeout):
                status, _, body = await self._client.request(
                    "POST",
                    url,
                    headers=headers,
                    body=urlencode(form).encode("ascii"),
                    read_limit=RESPONSE_LIMIT,
                )
        except TimeoutError:
            raise _unavailable(url, f"did not answer within {self._timeout:g} s") from None
        except Exception as exc:
            raise TokenUnavailable(_failed_request(url, exc)) from None
        document = _json(body)
        if not 200 <= status <= 299:
            code = document.get("error") if document is not None else None
            detail = f" ({code})" if isinstance(code, str) and _OAUTH_ERROR.fullmatch(code) else ""
            if 300 <= status <= 399:
                detail = " (a redirect, not followed)"
            raise _unavailable(url, f"answered {status}{detail}")
        if len(body) >= RESPONSE_LIMIT:
            raise _unavailable(url, f"answered more than {RESPONSE_LIMIT} bytes")
        if document is None:
            raise _unavailable(url, f"answered {status} without a JSON object")
        token = document.get("access_token")
        if not isinstance(token, str) or not _TOKEN.fullmatch(token):
            raise _unavailable(url, "answered no valid access_token")
        token_type = document.get("token_type")
        if not isinstance(token_type, str) or token_type.lower() != "bearer":
            shown_type = (
                repr(token_type)
                if isinstance(token_type, str) and _OAUTH_ERROR.fullmatch(token_type)
                else "missing or invalid"
            )
            raise _unavailable(url, f"answered token_type {shown_type}, not Bearer")
        return token, _lifetime(url, document.get("expires_in"))


def _json(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object, or None."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser
        return None
    return document if isinstance(document, dict) else None


def _lifetime(url: str, expires_in: object) -> float:
    """The lifetime ``expires_in`` gives (a number, or a string of digits as some
    servers send), :data:`DEFAULT_LIFETIME` without one."""
    if expires_in is None:
        return DEFAULT_LIFETIME
    seconds = _seconds(expires_in)
    if 0 < seconds < math.inf:
        return seconds
    raise _unavailable(url, "answered an invalid expires_in")


def _seconds(value: object) -> float:
    """``value`` as a number of seconds, NaN when it is none."""
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, str):
        return float(value) if value.isascii() and value.isdigit() else math.nan
    if isinstance(value, int):
        return float(min(value, 2**53))  # no OverflowError past any float
    if isinstance(value, float):
        return value
    return math.nan


def _unavailable(url: str, what: str) -> TokenUnavailable:
    return TokenUnavailable(
        Outcome(
            Verdict.RETRY,
            None,
            _bounded(f"OAuth2 token endpoint {shown(url)} {what}"),
            ERROR_CLASS,
            None,
        )
    )


def _failed_request(url: str, exc: Exception) -> Outcome:
    """The outcome of a token request that raised ``exc``: refused by the guard
    (blocked), our own error (uncounted, as a delivery's), else unreachable."""
    outcome = classify_exception(exc)
    text = f"OAuth2 token endpoint {shown(url)}"
    if outcome.verdict is Verdict.BLOCKED:
        return Outcome(
            Verdict.BLOCKED,
            None,
            _bounded(f"{text} refused: {outcome.error}"),
            outcome.error_class,
            None,
        )
    if outcome.error_class == "internal_error":
        return Outcome(
            Verdict.RETRY, None, _bounded(f"{text}: {outcome.error}"), outcome.error_class, None
        )
    return Outcome(
        Verdict.RETRY, None, _bounded(f"{text} unreachable: {outcome.error}"), ERROR_CLASS, None
    )


def _bounded(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 3] + "..."
