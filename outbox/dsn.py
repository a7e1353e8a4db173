"""Small helpers for PostgreSQL connection URLs."""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit


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


def libpq_url(url: str) -> str:
    """Return ``url`` as libpq/psycopg expect it (drops a SQLAlchemy ``+driver`` suffix)."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme == "postgres":
        scheme = "postgresql"
    return urlunsplit(parts._replace(scheme=scheme))
