"""Small helpers for PostgreSQL connection URLs."""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit, urlunsplit

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict

from outbox.errors import ConfigurationError

_QUOTED = re.compile(r'"[^"]*"')


def with_database(url: str, database: str) -> str:
    """Return ``url`` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(database, safe="")))


def sqlalchemy_url(url: str) -> str:
    """Return ``url`` with the ``postgresql+psycopg`` driver name SQLAlchemy needs.

    The same URL serves sync and async engines: psycopg 3 does both.
    """
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        parts = parts._replace(scheme="postgresql+psycopg")
    return urlunsplit(parts)


def redact(url: str) -> str:
    """Return ``url`` with any password replaced, for messages and logs."""
    parts = urlsplit(url)
    if parts.password:
        host = parts.netloc.rsplit("@", 1)[-1]
        user = parts.username or ""
        parts = parts._replace(netloc=f"{user}:***@{host}")
    return urlunsplit(parts)


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def libpq_url(url: str, *, field: str = "database_url") -> str:
    """Return ``url`` as libpq/psycopg expect it (drops a SQLAlchemy ``+driver`` suffix).

    Raises :class:`~outbox.errors.ConfigurationError` naming ``field`` (where the
    URL came from: an option, a variable) when its scheme is not PostgreSQL's
    (``postgresq://``) or libpq cannot parse it (``postgresql://u:pw@[::1/db``), so a
    typo is one line rather than a failure at the first connection. The message
    never quotes the URL: it may hold a password.
    """
    named = _SCHEME.match(url)
    if named is not None and named[1].split("+", 1)[0] not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"{field}: the scheme must be postgresql:// or postgres://, not {named[1]}://"
        )
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.split("+", 1)[0]
        if scheme == "postgres":
            scheme = "postgresql"
        checked = urlunsplit(parts._replace(scheme=scheme))
        conninfo_to_dict(checked)
    except (ValueError, ProgrammingError) as exc:
        problem = _QUOTED.sub('"..."', str(exc).splitlines()[0] if str(exc) else "")
        raise ConfigurationError(
            f"{field}: is not a PostgreSQL URL libpq can parse ({problem})"
        ) from None
    return checked
