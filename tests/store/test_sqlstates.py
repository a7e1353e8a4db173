"""Database errors as transient or permanent: the table row by row, and the
errors that carry no SQLSTATE."""

from __future__ import annotations

import psycopg
import psycopg_pool
import pytest

from dispatchers.store.sqlstates import (
    RULES,
    UNKNOWN,
    Kind,
    Rule,
    classify,
    describe,
    is_transient,
    is_unreachable,
    rule_for,
)

T, P = Kind.TRANSIENT, Kind.PERMANENT


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.sqlstate)
def test_each_rule_classes_its_sqlstate(rule: Rule) -> None:
    # a class's rule covers the codes of its class that no rule names
    sqlstate = rule.sqlstate if len(rule.sqlstate) == 5 else rule.sqlstate + "ZZZ"
    assert rule_for(sqlstate) is rule


def test_the_table_names_each_sqlstate_once_as_a_class_or_a_code() -> None:
    states = [rule.sqlstate for rule in RULES]
    assert len(set(states)) == len(states)
    assert all(len(state) in (2, 5) for state in states)


@pytest.mark.parametrize(
    ("sqlstate", "kind"),
    [
        ("08000", T),  # connection exception
        ("08006", T),  # connection failure
        ("08001", T),  # the client could not establish a connection
        ("57P01", T),  # admin shutdown (pg_terminate_backend)
        ("57P02", T),  # crash shutdown
        ("57P03", T),  # cannot connect now
        ("40001", T),  # serialization failure
        ("40P01", T),  # deadlock detected
        ("55P03", T),  # lock not available (lock_timeout)
        ("57014", T),  # query canceled (statement_timeout)
        ("53300", T),  # too many connections
        ("53200", T),  # out of memory
        ("28P01", P),  # invalid password
        ("28000", P),  # invalid authorization specification (no such role)
        ("3D000", P),  # the database does not exist
        ("3F000", P),  # the schema does not exist
        ("42P01", P),  # undefined table
        ("42883", P),  # undefined function
        ("42501", P),  # insufficient privilege
        ("42601", P),  # syntax error
        ("22003", P),  # numeric value out of range
        ("22008", P),  # datetime field overflow
        ("F0000", P),  # configuration file error
        ("57P04", P),  # database dropped
        ("23514", P),  # check violation: no rule, so permanent
        ("XX000", P),  # internal error: no rule, so permanent
    ],
)
def test_sqlstates_are_classed(sqlstate: str, kind: Kind) -> None:
    assert rule_for(sqlstate).kind is kind
    error = psycopg.errors.lookup(sqlstate)("from the server")
    assert error.sqlstate == sqlstate
    assert classify(error) is kind
    assert is_transient(error) is (kind is T)


def test_a_sqlstate_no_rule_names_is_permanent() -> None:
    assert rule_for("23505") is UNKNOWN
    assert UNKNOWN.kind is P


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        # raised by libpq without a SQLSTATE: the connection failed or was lost
        (psycopg.OperationalError("connection failed"), T),
        (psycopg.InterfaceError("the connection is closed"), T),
        (psycopg_pool.PoolTimeout("no connection within 3 s"), T),
        (psycopg_pool.TooManyRequests("the pool's queue is full"), T),
        (ConnectionResetError("reset by peer"), T),
        (TimeoutError("no answer within 6 s"), T),
        # a client-side misuse, and a bug: retrying will not help
        (psycopg.ProgrammingError("query parameter missing"), P),
        (ValueError("bug"), P),
    ],
)
def test_errors_without_a_sqlstate_are_classed_by_type(exc: BaseException, kind: Kind) -> None:
    assert classify(exc) is kind


def test_an_error_is_described_on_one_line_with_its_sqlstate() -> None:
    error = psycopg.errors.InsufficientPrivilege("permission denied\nfor table messages")
    assert describe(error) == "permission denied for table messages (SQLSTATE 42501)"
    assert describe(OSError()) == "OSError"


@pytest.mark.parametrize(
    ("exc", "unreachable"),
    [
        # nothing answered: the connection, the pool, our bound, a server going away
        (psycopg.OperationalError("connection failed"), True),
        (psycopg.InterfaceError("the connection is closed"), True),
        (psycopg_pool.PoolTimeout("no connection within 3 s"), True),
        (ConnectionResetError("reset by peer"), True),
        (TimeoutError("no answer within 6 s"), True),
        (psycopg.errors.lookup("08006")("connection failure"), True),
        (psycopg.errors.lookup("57P01")("terminating connection"), True),
        (psycopg.errors.lookup("57P03")("the database system is starting up"), True),
        # the server answered, with an error of its own
        (psycopg.errors.lookup("55P03")("lock not available"), False),
        (psycopg.errors.lookup("57014")("canceling statement due to statement timeout"), False),
        (psycopg.errors.lookup("40001")("could not serialize access"), False),
        (psycopg.errors.lookup("42501")("permission denied"), False),
        (psycopg.errors.lookup("57P04")("database dropped"), False),
        (ValueError("bug"), False),
    ],
)
def test_only_errors_that_no_server_answered_are_unreachable(
    exc: BaseException, unreachable: bool
) -> None:
    assert is_unreachable(exc) is unreachable
