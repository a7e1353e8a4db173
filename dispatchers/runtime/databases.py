"""The databases one dispatcher process serves, and the file that lists them.

Each ``--database-url`` and each ``[[database]]`` entry of a ``--databases`` TOML
file (``url``, ``schema``, ``label``) is checked before anything connects; an
error names the entry and the field, never quoting a URL. A database's label
names it everywhere, holds no secret, and is unique.

Design: docs/explanation/design/databases.md
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from psycopg.conninfo import conninfo_to_dict

from outbox.defaults import DEFAULT_SCHEMA
from outbox.dsn import libpq_url
from outbox.errors import ConfigurationError
from outbox.internal import check_schema_name

__all__ = ["MAX_DATABASES", "Served", "default_label", "parse_databases", "served"]

MAX_DATABASES = 256
"""The most databases one process serves: each holds a pool of connections and a
listening one, and each gets at least one request slot."""

MAX_LABEL = 100
"""The longest label: a metrics label value and a log field, kept short."""

FIELDS = ("url", "schema", "label")
"""The fields of a ``[[database]]`` entry."""


@dataclass(frozen=True)
class Served:
    """One database (and schema) that a process serves."""

    url: str = field(repr=False)  # may hold a password
    schema: str
    label: str


def default_label(url: str, schema: str) -> str:
    """``host:port/dbname``, and ``/schema`` unless it is the default: the
    database's name without the user or password (nor the query, which may hold
    one)."""
    parts = conninfo_to_dict(url)
    host = str(parts.get("host") or "localhost")
    if host.startswith("/"):  # a Unix socket's directory says nothing useful
        host = "localhost"
    label = f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"
    return label if schema == DEFAULT_SCHEMA else f"{label}/{schema}"


def served(urls: Sequence[str], schema: str, entries: Iterable[Served] = ()) -> tuple[Served, ...]:
    """The databases of ``--database-url`` (each in ``schema``) followed by those of
    a ``--databases`` file; raise ConfigurationError when two share a label (the
    same database and schema twice, or labels given twice)."""
    listed: list[Served] = []
    for number, url in enumerate(urls, 1):
        name = "--database-url" if len(urls) == 1 else f"--database-url (the {_ordinal(number)})"
        checked = libpq_url(url, field=name)
        listed.append(Served(checked, schema, default_label(checked, schema)))
    listed.extend(entries)
    if len(listed) > MAX_DATABASES:
        raise ConfigurationError(f"databases: at most {MAX_DATABASES}, got {len(listed)}")
    seen: dict[str, int] = {}
    for number, db in enumerate(listed, 1):
        if db.label in seen:
            raise ConfigurationError(
                f"database {number} ({db.label}): label: already names database "
                f"{seen[db.label]}; the same database and schema twice, or give each a "
                "label of its own"
            )
        seen[db.label] = number
    return tuple(listed)


def parse_databases(text: str, *, source: str, schema: str = DEFAULT_SCHEMA) -> list[Served]:
    """The entries of a ``--databases`` file (``source`` names it in errors);
    ``schema`` is that of an entry without one."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{source}: not TOML: {exc}") from None
    extra = sorted(set(document) - {"database"})
    if extra:
        raise ConfigurationError(
            f"{source}: unknown table or key {extra[0]!r}; the file holds [[database]] entries"
        )
    entries = document.get("database")
    if not isinstance(entries, list) or not entries:
        raise ConfigurationError(f"{source}: no [[database]] entry")
    return [_entry(source, number, entry, schema) for number, entry in enumerate(entries, 1)]


def _entry(source: str, number: int, entry: object, schema: str) -> Served:
    where = f"{source}: [[database]] {number}"
    if not isinstance(entry, Mapping):
        raise ConfigurationError(f"{where}: must be a table of {', '.join(FIELDS)}")
    label = entry.get("label")
    if label is not None:
        if not isinstance(label, str) or not label.strip():
            raise ConfigurationError(f"{where}: label: must be a non-empty string")
        if len(label) > MAX_LABEL or not label.isprintable():
            raise ConfigurationError(
                f"{where}: label: must be printable, at most {MAX_LABEL} characters"
            )
        where = f"{where} ({label})"
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(FIELDS)}"
        )
    url = entry.get("url")
    if not isinstance(url, str) or not url:
        raise ConfigurationError(f"{where}: url: required, a PostgreSQL URL")
    url = libpq_url(url, field=f"{where}: url")
    named = entry.get("schema", schema)
    if not isinstance(named, str):
        raise ConfigurationError(f"{where}: schema: must be a string")
    try:
        check_schema_name(named)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None
    return Served(url, named, label if label is not None else default_label(url, named))


def _ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"
