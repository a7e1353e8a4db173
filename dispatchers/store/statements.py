"""The dispatcher's statements: the ``.sql`` files of ``dispatchers/store/sql``.

One file per family, each read top to bottom (its fragments before the
statements that include them): ``claim.sql`` (the three claims),
``complete.sql`` (completion, and the rescue of expired leases, which passes on
slots as completion does), ``leases.sql`` (renewal), ``retention.sql`` (history
removal and the drain check), ``health.sql`` (circuit breakers and holds),
``session.sql`` (timeouts, the waker's session and locks) and
``preflight.sql`` (the start-up checks) and ``alerts.sql`` (the alerts a
dispatcher raises). They are loaded by the library's loader
(:mod:`outbox._queries`) as a catalog of their own, so the library, which never
runs them, never loads them; what the dispatcher runs of the library's (such as
``migrations_applied``) it takes from :func:`outbox._queries.queries_for`.
The web surfaces' reads (``web/sql``) are a sibling catalog, :func:`web_queries`.
"""

from __future__ import annotations

from pathlib import Path

from outbox.internal import Queries, catalog

SQL_DIR = Path(__file__).parent / "sql"
"""The dispatcher's ``.sql`` files (shipped in the wheel with the package)."""


WEB_SQL_DIR = Path(__file__).parent / "web" / "sql"
"""The web surfaces' ``.sql`` files, one per resource (:mod:`dispatchers.store.web`)."""


def store_queries(schema: str) -> Queries:
    """The dispatcher's statements bound to ``schema`` (cached by the loader)."""
    return catalog(schema, (SQL_DIR,))


def web_queries(schema: str) -> Queries:
    """The web surfaces' statements bound to ``schema`` (cached by the loader):
    a catalog of their own, so that the dispatcher's role never plans them."""
    return catalog(schema, (WEB_SQL_DIR,))
