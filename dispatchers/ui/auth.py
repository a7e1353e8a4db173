"""Who may use the dashboard: sessions, the login token, CSRF tokens, loopback.

Pure logic, without aiohttp; the middleware in :mod:`dispatchers.ui.app` applies it.

- Without a token the dashboard serves only loopback, and refuses a request
  naming another host in its ``Host`` header (DNS rebinding); visitors are ``local``.
- With a token, a visitor signs in once; the token is compared in constant time
  and never stored in the cookie, a random session id signed with a key made at
  start-up, sent HttpOnly and SameSite=Strict.
- Every POST carries a CSRF token derived from the session id, checked in
  constant time.
- Sign-in attempts are counted per client address when they start
  (:class:`SignInLimit`): a few a minute, then the address is refused.
- Every comparison is of bytes: a value with any character is refused, never an error.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from collections import deque
from collections.abc import Callable

from dispatchers.ui.limits import SIGN_IN_ATTEMPTS, SIGN_IN_WINDOW

COOKIE = "outbox_ui"
"""The name of the session cookie."""

LOCAL = "local"
"""Who acts when the dashboard has no token: whoever can reach loopback."""

_LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``),
    bracketed or not."""
    name = host.strip().lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host part of a ``Host`` header: without the port, brackets kept off."""
    header = header.strip()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def token_id(token: str) -> str:
    """How the log names the holder of ``token``: a hash prefix that reveals none
    of it."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:8]


def _same(given: str, expected: str) -> bool:
    """Whether two strings are equal, compared in constant time as UTF-8 bytes
    (:func:`hmac.compare_digest` refuses a ``str`` that is not ASCII)."""
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


class SignInLimit:
    """At most ``failures`` sign-in attempts per client address in any ``window``
    seconds that did not succeed, counted in memory (a restart forgets them, as
    it forgets sessions).

    An attempt is counted as it starts (:meth:`reserve`), before the token it
    carries is read, and forgotten only when that token was right
    (:meth:`succeeded`): so many attempts in flight at once are each counted
    before any is judged, and past the limit the rest are refused unread.

    The table holds at most ``clients`` addresses: past that, addresses whose
    failures have all aged out go first, then the longest known, so a flood of
    addresses costs bounded memory (and the flooded-out addresses get a fresh
    count, no more than they would after a restart)."""

    def __init__(
        self,
        *,
        failures: int = SIGN_IN_ATTEMPTS,
        window: float = SIGN_IN_WINDOW,
        clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._failures = failures
        self._window = window
        self._clients = clients
        self._clock = clock
        self._seen: dict[str, deque[float]] = {}

    def blocked(self, client: str) -> bool:
        """Whether ``client`` has used up its attempts for now."""
        times = self._seen.get(client)
        if times is None:
            return False
        self._age(times)
        return len(times) >= self._failures

    def reserve(self, client: str) -> bool:
        """Count an attempt of ``client`` that is about to be judged, unless it
        has used up its attempts: then False, and the attempt must be refused
        without being judged. Checking and counting are one step (no ``await``
        between them), so concurrent attempts cannot all pass the check."""
        if self.blocked(client):
            return False
        times = self._seen.setdefault(client, deque(maxlen=self._failures))
        times.append(self._clock())
        if len(self._seen) > self._clients:
            self._shrink()
        return True

    def succeeded(self, client: str) -> None:
        """Forget ``client``'s attempts: it gave the right token."""
        self._seen.pop(client, None)

    def _age(self, times: deque[float]) -> None:
        horizon = self._clock() - self._window
        while times and times[0] <= horizon:
            times.popleft()

    def _shrink(self) -> None:
        for client, times in list(self._seen.items()):
            self._age(times)
            if not times:
                del self._seen[client]
        while len(self._seen) > self._clients:
            del self._seen[next(iter(self._seen))]


class Guard:
    """The dashboard's key, its optional login token, and the rules above."""

    def __init__(self, *, token: str | None, key: bytes | None = None) -> None:
        if token is not None and not token:
            raise ValueError("the token must not be empty")
        self._token = token
        self._key = key if key is not None else secrets.token_bytes(32)
        self.sign_ins = SignInLimit()

    @property
    def login_required(self) -> bool:
        return self._token is not None

    @property
    def principal(self) -> str:
        """Who acts for the log: the token's id, or ``local``."""
        return LOCAL if self._token is None else token_id(self._token)

    def accepts_token(self, given: str) -> bool:
        """Whether ``given`` is the login token (constant time)."""
        if self._token is None:
            return False
        return _same(given, self._token)

    def allows_host(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header may be served: any with a token;
        only loopback names without one."""
        return self.login_required or (header is not None and is_loopback(host_of(header)))

    def new_session(self) -> tuple[str, str]:
        """A new session: its random id, and the cookie value (the id, signed)."""
        sid = secrets.token_urlsafe(18)
        return sid, f"{sid}.{self._sign('session', sid)}"

    def session_id(self, cookie: str | None) -> str | None:
        """The session id of a cookie value, or None if it was not signed here."""
        if not cookie or "." not in cookie:
            return None
        sid, signature = cookie.rsplit(".", 1)
        if not _same(signature, self._sign("session", sid)):
            return None
        return sid

    def csrf_token(self, sid: str) -> str:
        """The CSRF token of the forms of session ``sid``."""
        return self._sign("csrf", sid)

    def accepts_csrf(self, sid: str, given: str | None) -> bool:
        """Whether ``given`` is session ``sid``'s CSRF token (constant time)."""
        return given is not None and _same(given, self.csrf_token(sid))

    def _sign(self, purpose: str, value: str) -> str:
        return hmac.new(self._key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()
