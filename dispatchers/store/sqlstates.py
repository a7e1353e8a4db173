"""Database errors as transient or permanent: one table, by SQLSTATE.

A transient error (the connection dropped, the server restarting, a lost race,
one of our own timeouts) is tried again with backoff for as long as it lasts; a
permanent one (a refused role, a missing privilege, schema or table, a value out
of range) makes a dispatcher that keeps meeting it stop
(:mod:`dispatchers.runtime.watchdog`). Errors are classified by SQLSTATE, never
by message text: a :class:`Rule` names a class (two characters) or a code
(five), the longest matching rule wins, and a SQLSTATE no rule names is
permanent. Without a SQLSTATE: psycopg's ``OperationalError`` (libpq could not
open or keep a connection) is a connection lost, transient while running (at
start-up :mod:`dispatchers.store.preflight` takes it as final); a pool timeout,
an ``OSError`` and a ``TimeoutError`` are transient; anything else is permanent.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import psycopg
import psycopg_pool

__all__ = [
    "RULES",
    "UNKNOWN",
    "Kind",
    "Rule",
    "classify",
    "describe",
    "is_transient",
    "is_unreachable",
    "rule_for",
]


class Kind(enum.Enum):
    """Whether a later try may succeed where this one failed."""

    TRANSIENT = "transient"
    PERMANENT = "permanent"


@dataclass(frozen=True, slots=True)
class Rule:
    """A SQLSTATE class or code, and what errors under it are."""

    sqlstate: str
    kind: Kind
    meaning: str


_T, _P = Kind.TRANSIENT, Kind.PERMANENT

RULES: tuple[Rule, ...] = (
    # transient: the connection, the server's state, a race, our own bounds
    Rule("08", _T, "connection exception: the connection failed or was lost"),
    Rule("25P03", _T, "idle in transaction too long: the server ended the session"),
    Rule("40", _T, "transaction rollback: serialization failure, deadlock"),
    Rule("53", _T, "insufficient resources: out of connections, memory or disk"),
    Rule("55P03", _T, "lock not available: our lock_timeout"),
    Rule("57014", _T, "query canceled: our statement_timeout"),
    Rule("57P01", _T, "admin shutdown: the server is stopping or ended the session"),
    Rule("57P02", _T, "crash shutdown: the server is restarting after a crash"),
    Rule("57P03", _T, "cannot connect now: the server is starting up"),
    Rule("57P05", _T, "idle session timeout: the server ended the session"),
    Rule("58000", _T, "system error outside PostgreSQL"),
    Rule("58030", _T, "I/O error"),
    # permanent: configuration, rights, schema, data
    Rule("22", _P, "data exception: a value out of range or malformed"),
    Rule("28", _P, "invalid authorization: the role or its password was refused"),
    Rule("3D000", _P, "invalid catalog name: the database does not exist"),
    Rule("3F000", _P, "invalid schema name: the schema does not exist"),
    Rule("42", _P, "syntax error or access rule violation"),
    Rule("42501", _P, "insufficient privilege: the role lacks a grant"),
    Rule("42P01", _P, "undefined table: the schema is not migrated"),
    Rule("42883", _P, "undefined function: the schema is not migrated"),
    Rule("57P04", _P, "database dropped"),
    Rule("F0", _P, "configuration file error"),
)
"""Every SQLSTATE class or code with a known kind; the longest match wins."""

_BY_SQLSTATE = {rule.sqlstate: rule for rule in RULES}

UNKNOWN = Rule("", _P, "an error no rule names")
"""What a SQLSTATE that no rule names is."""


def rule_for(sqlstate: str) -> Rule:
    """The rule of ``sqlstate``: its code's, else its class's, else :data:`UNKNOWN`."""
    return _BY_SQLSTATE.get(sqlstate) or _BY_SQLSTATE.get(sqlstate[:2]) or UNKNOWN


def classify(exc: BaseException) -> Kind:
    """Whether ``exc``, met while running, may heal by trying again."""
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.TooManyRequests):
        return Kind.TRANSIENT
    if isinstance(exc, psycopg.Error):
        if exc.sqlstate is not None:
            return rule_for(exc.sqlstate).kind
        # raised by the client: libpq lost the connection or could not open it
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return Kind.TRANSIENT
        return Kind.PERMANENT
    if isinstance(exc, OSError | TimeoutError):
        return Kind.TRANSIENT
    return Kind.PERMANENT


def is_transient(exc: BaseException) -> bool:
    """True when :func:`classify` says a later try may not meet ``exc`` again."""
    return classify(exc) is Kind.TRANSIENT


UNREACHABLE_SQLSTATES = ("08", "57P01", "57P02", "57P03")
"""The SQLSTATEs (a class or codes) of a server that is going away or not yet
there: the connection failed, or the server is shutting down or starting."""


def is_unreachable(exc: BaseException) -> bool:
    """True when ``exc`` says the database did not answer at all: the connection
    was lost or could not be opened (no SQLSTATE: the client's side), the pool
    had none to give, no answer came within our bound, or the server is going
    away or not up yet. A statement that the server ended with an error of its
    own (a lock or statement timeout, a serialization failure, a missing
    privilege) was answered: the database is there."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return True
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state is None:
            return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        return state[:2] in UNREACHABLE_SQLSTATES or state in UNREACHABLE_SQLSTATES
    return isinstance(exc, OSError | TimeoutError)


def describe(exc: BaseException) -> str:
    """``exc`` on one line, for an operator: its SQLSTATE, if it has one, and its
    message (libpq's may span lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None)
    return f"{text} (SQLSTATE {sqlstate})" if sqlstate else text
