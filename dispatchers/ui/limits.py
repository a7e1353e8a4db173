"""The dashboard's bounds, defined once: what a connection may hold, how many
sign-in attempts an address gets, how long a page may be.

Pure constants and one value object, without aiohttp or the database, so the
command's help quotes them without importing the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CONNECTIONS = 256
"""The most connections the dashboard holds open at once; past it, a connection
is answered 503 and closed at once (a flood of idle connections cannot take
every file descriptor)."""

HEADER_TIMEOUT = 10.0
"""Seconds a connection has to send a whole request's headers, from when it
opens or its previous answer was sent; then it is closed."""

BODY_TIMEOUT = 10.0
"""Seconds a request has to send its form (at most 64 KiB); then it is answered
408."""

CONNECTION_WAIT = 5.0
"""Seconds a page, an action or a request of the API waits for a connection to
the database (connecting included); past it, it is answered 503 (the database
is unreachable, or every connection was busy that long)."""

SIGN_IN_ATTEMPTS = 5
"""Sign-in attempts an address may make in :data:`SIGN_IN_WINDOW` seconds
without giving the right token."""

SIGN_IN_WINDOW = 60.0

ENDPOINTS_PAGE = 100
"""The most endpoints one page of the endpoints list shows."""

TENANTS_PAGE = 100
"""The most tenants one page of the tenants list shows."""

TABLE_ROWS = 100
"""The most endpoints needing attention, and held or policed destinations, the
overview lists (it says how many there are, and links to the rest): the page
stays small however many there are, and it refreshes every few seconds."""


@dataclass(frozen=True)
class Limits:
    """What the dashboard's server allows a connection (see the constants)."""

    max_connections: int = MAX_CONNECTIONS
    header_timeout: float = HEADER_TIMEOUT
    body_timeout: float = BODY_TIMEOUT

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if not self.header_timeout > 0 or not self.body_timeout > 0:
            raise ValueError("timeouts must be positive")
