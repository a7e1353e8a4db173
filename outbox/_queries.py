"""Named SQL statements, loaded from ``.sql`` files and bound to one schema.

The library's own are ``sql/queries/*.sql`` (:func:`queries_for`); the runtime
keeps its statements in its own packages and loads them here too, as catalogs of
their own (:func:`catalog`), so that the library never loads them.

Statements are written once, in psycopg's ``%(name)s`` parameter style. The same
text serves psycopg connections directly and SQLAlchemy connections through
:func:`sqlalchemy.text`, after the parameters are rewritten as ``:name``.
"""

from __future__ import annotations

import functools
import hashlib
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg import sql

from outbox.errors import ConfigurationError, OutboxError

_HEADER = re.compile(r"^-- (name|fragment):[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_FRAGMENT = re.compile(r"\{(\w+)\}")
_NAME = re.compile(r"^\w+\Z", re.ASCII)
_PYFORMAT = re.compile(r"%\((\w+)\)s")
_SCHEMA = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")


WAKE_LOCK_CLASS = 0x4F425701
"""First key of the advisory lock that a dispatcher waiting for notifications
holds (see ``dispatchers.runtime.waker``); the second is :func:`lock_object_id`."""

DUTY_LOCK_CLASS = 0x4F424401
"""First key of the advisory lock of the dispatcher on duty (``dispatchers.runtime.waker``)."""


def lock_object_id(schema: str) -> int:
    """The second key of the outbox's advisory locks for ``schema``: a signed
    32-bit digest of its name, so that each schema's dispatchers have their own."""
    digest = zlib.crc32(schema.encode())
    return digest - (1 << 32) if digest >= 1 << 31 else digest


def check_schema_name(schema: str) -> str:
    """Return ``schema`` if it is a plain identifier and not one of PostgreSQL's own
    schemas (``information_schema``, ``pg_catalog`` and every ``pg_`` name), else
    raise ConfigurationError. ``public`` is allowed: it is the user's."""
    if not isinstance(schema, str) or not _SCHEMA.match(schema):
        raise ConfigurationError(
            f"schema: {_shown(schema)} is not a plain identifier (letters, digits and _, "
            "starting with a letter or _, at most 48 characters)"
        )
    if schema.lower() == "information_schema" or schema.lower().startswith("pg_"):
        raise ConfigurationError(
            f"schema: {schema!r} is PostgreSQL's own (information_schema and pg_ names "
            "are reserved for the system); choose another"
        )
    return schema


def _shown(value: object) -> str:
    """``value`` as an error message quotes it: in full up to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


@dataclass(frozen=True)
class Statement:
    """One SQL statement: psycopg text, and the same text for SQLAlchemy."""

    name: str
    text: str
    #: the text as psycopg is given it: encoded once here, where psycopg would
    #: encode a ``str`` on every execution. Plain ASCII (so the same bytes in every
    #: client encoding), which loading checks.
    query: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "query", self.text.encode("ascii"))

    @functools.cached_property
    def sqlalchemy(self) -> Any:
        """The statement as a SQLAlchemy ``TextClause`` (built once)."""
        from sqlalchemy import text

        return text(_PYFORMAT.sub(r":\1", self.text))

    @functools.cached_property
    def prepared(self) -> Prepared:
        """The statement as a server-side prepared statement (built once)."""
        return Prepared.of(self)


@dataclass(frozen=True)
class Prepared:
    """A statement as SQL-level ``PREPARE`` and ``EXECUTE`` texts.

    The name holds a digest of the text, so a prepared statement of that name on any
    server connection (a pooler shares them between clients) is this very text.
    ``execute`` takes the statement's own psycopg parameters, bound client-side.
    """

    name: str
    prepare: str
    execute: str

    @classmethod
    def of(cls, statement: Statement) -> Prepared:
        order: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in order:
                order.append(match.group(1))
            return f"${order.index(match.group(1)) + 1}"

        body = _PYFORMAT.sub(number, statement.text)
        digest = hashlib.sha256(statement.text.encode()).hexdigest()[:12]
        name = f"outbox_{statement.name}_{digest}"
        args = ", ".join(f"%({p})s" for p in order)
        return cls(
            name=name,
            prepare=f"PREPARE {name} AS {body}",
            execute=f"EXECUTE {name}({args})" if order else f"EXECUTE {name}",
        )


def sql_dir() -> Path:
    """The ``sql/`` directory: packaged inside ``outbox`` in a wheel (as ``_sql``), or
    next to the package in a source checkout (and so an editable install)."""
    here = Path(__file__).parent
    for candidate in (here / "_sql", here.parent / "sql"):
        if candidate.is_dir():
            return candidate
    raise OutboxError(f"no SQL files found in {here / '_sql'} or {here.parent / 'sql'}")


@dataclass(frozen=True)
class _Source:
    """One named statement as written, before it is bound to a schema."""

    file: str
    body: str
    notify: bool = False  # the "_notify" twin: "{notify}" becomes the wake-up call


def parse(file: str, text: str) -> dict[str, str]:
    """The statements of one ``.sql`` file by name, from its ``-- name: x`` headers.

    A header whose name is not a plain identifier is an error rather than a line of
    the statement above it (the name becomes part of a prepared statement's name).
    A ``-- fragment: x`` header starts a piece of SQL that statements (and later
    fragments) of the same file include as ``{x}``: text that several statements
    must share word for word, written once.
    """
    parts = _HEADER.split(text)
    # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
    statements: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for header, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        kind = "statement" if header == "name" else "fragment"
        if not _NAME.match(name):
            raise OutboxError(f"{file}: {name!r} is not a {kind} name (letters, digits, _)")
        if name in statements or name in fragments:
            raise OutboxError(f"{file}: {kind} {name!r} is named twice")
        body = _FRAGMENT.sub(lambda m: fragments.get(m[1], m[0]), _without_comments(body))
        (statements if kind == "statement" else fragments)[name] = body
    return statements


def _without_comments(body: str) -> str:
    """``body`` without its ``--`` comments and blank lines.

    The comments are for whoever reads the files; the driver is given the bare
    statement. psycopg parses a statement's placeholders again on every execution
    when its text is longer than it caches (4 KiB): without comments, publish
    (4.5 KiB with them) fits, and the claims parse in about half the time. A
    ``--`` inside a quoted string is text, not a comment.
    """
    lines = []
    for line in body.splitlines():
        quoted = False
        for i, char in enumerate(line):
            if char == "'":
                quoted = not quoted
            elif char == "-" and not quoted and line.startswith("--", i):
                line = line[:i]
                break
        if line.strip():
            lines.append(line.rstrip())
    return "\n".join(lines)


def collect(files: Mapping[str, str]) -> dict[str, _Source]:
    """Every statement of ``files`` (file name -> text), by name, unique across files:
    callers look statements up by name alone. The ``_notify`` twin of a statement
    with a ``{notify}`` fragment counts as a name of its own."""
    found: dict[str, _Source] = {}
    for file, text in files.items():
        for name, body in parse(file, text).items():
            twins = {name: False, f"{name}_notify": True} if "{notify}" in body else {name: False}
            for each, notify in twins.items():
                if each in found:
                    raise OutboxError(
                        f"statement {each!r} is named in both {found[each].file} and {file}"
                    )
                found[each] = _Source(file, body, notify)
    return found


def library_paths() -> tuple[Path, ...]:
    """Where the library's own statements are: ``sql/queries``."""
    return (sql_dir() / "queries",)


def _files(paths: tuple[Path, ...]) -> dict[str, str]:
    """The text of every ``.sql`` file of ``paths`` by file name (without ``.sql``):
    each path a directory (its ``*.sql`` files, in name order) or one ``.sql`` file."""
    files: dict[str, str] = {}
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.sql"))
        elif path.suffix == ".sql" and path.is_file():
            found = [path]
        else:
            raise OutboxError(f"no SQL files found in {path}")
        for file in found:
            if file.stem in files:
                raise OutboxError(f"two statement files are named {file.name} (one is {file})")
            files[file.stem] = file.read_text("utf-8")
    return files


@functools.cache
def _sources(paths: tuple[Path, ...]) -> dict[str, _Source]:
    return collect(_files(paths))


class Queries:
    """The named statements of a set of ``.sql`` files, bound to one schema.

    Files group statements by audience (``enqueue``, ``endpoints``, ``admin``, ...);
    names are unique across the files of one catalog, so a statement is looked up
    by name alone. ``paths`` are directories (their ``*.sql`` files) or single
    ``.sql`` files; by default the library's own, ``sql/queries`` (see
    :func:`queries_for`). The runtime's statements are catalogs of their own, in
    its packages (``dispatchers.store.statements`` and others). Fragments:
    ``{schema}`` (the quoted schema), ``{channel}`` (the quoted notification
    channel) and ``{notify}`` (see below).
    """

    def __init__(self, schema: str, paths: tuple[Path, ...] | None = None) -> None:
        check_schema_name(schema)
        self.schema = schema
        self.paths = library_paths() if paths is None else tuple(paths)
        self.channel = f"{schema}_ready"
        self.wake_lock = (WAKE_LOCK_CLASS, lock_object_id(schema))
        # Notify only when a dispatcher waits for it (it holds the wake lock, so
        # this transaction cannot take it shared; see dispatchers.runtime.waker).
        # Otherwise the shared lock is held until commit, which keeps a dispatcher
        # from starting to wait before this transaction's messages are visible.
        # Built here from parts, not written in a .sql file: its lock keys and
        # channel are this schema's, and it is spliced into statements of several
        # files. Its column is named, so that rows are still read by name.
        notify = sql.SQL(
            ", CASE WHEN pg_try_advisory_xact_lock_shared({}, {}) THEN NULL"
            " ELSE pg_notify({}, '') END AS notified"
        ).format(*map(sql.Literal, self.wake_lock), sql.Literal(self.channel))
        parts = {"schema": sql.Identifier(schema), "channel": sql.Identifier(self.channel)}
        self._statements: dict[str, Statement] = {}
        self._files: dict[str, list[str]] = {}
        for name, source in _sources(self.paths).items():
            with_notify = notify if source.notify else sql.SQL("")
            text = sql.SQL(source.body).format(notify=with_notify, **parts).as_string(None)
            self._statements[name] = Statement(name, text)
            self._files.setdefault(source.file, []).append(name)

    def __getitem__(self, name: str) -> Statement:
        return self._statements[name]

    def __contains__(self, name: object) -> bool:
        return name in self._statements

    def names(self, file: str | None = None) -> list[str]:
        """Names of every statement (of ``file``, such as ``"enqueue"``), in file order."""
        if file is None:
            return list(self._statements)
        return list(self._files[file])

    def files(self) -> list[str]:
        """The names of the files the statements come from (without ``.sql``)."""
        return list(self._files)


@functools.lru_cache(maxsize=64)
def catalog(schema: str, paths: tuple[Path, ...]) -> Queries:
    """The (cached) statements of ``paths`` bound to ``schema``: one catalog per
    schema and set of files, such as the dispatcher's
    (``dispatchers.store.statements.store_queries``)."""
    return Queries(schema, paths)


@functools.lru_cache(maxsize=32)
def queries_for(schema: str) -> Queries:
    """The (cached) statements of the library (``sql/queries``) bound to ``schema``."""
    return catalog(schema, library_paths())
