"""Every statement each role runs, planned as that role: none wants a privilege
that ``outbox roles`` did not grant it.

Privileges are checked when a statement starts, and EXPLAIN (without ANALYZE)
starts it without running it: so each statement of the files a role's code runs
is explained as that role, with every parameter NULL, and must not be refused
(a ``SELECT *`` or ``RETURNING *`` on a table granted by columns would be). The
sequences a statement takes ids from (nextval) are checked in its text: a
function's privileges are checked only when it runs. What the statements do as
each role is the end-to-end tests' (test_roles.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from outbox._queries import queries_for
from outbox.roles import SEQUENCES, holds
from tests.conftest import PgServer
from tests.integration.test_roles import Roles, grant_all, made_roles

SCHEMA = "outbox"

#: the statement files whose statements each role's code runs
FILES = {
    # the library in the application's transaction: enqueue and publish
    "producer": ("enqueue",),
    # outbox dispatch, its preflight and its waker; it checks the schema's version
    "dispatcher": ("dispatch",),
    # the admin commands and the dashboard
    "operator": ("admin", "endpoints", "destinations", "event_types", "slots", "ui"),
}
ALSO = {"dispatcher": ("migrations_applied",)}

_EXPLAINED = re.compile(r"^\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
_NEXTVAL = re.compile(r"""nextval\('"?\w+"?\.(\w+)'\)""")


def statements(kind: str) -> list[str]:
    queries = queries_for(SCHEMA)
    return [name for file in FILES[kind] for name in queries.names(file)] + list(ALSO.get(kind, ()))


@pytest.fixture
def roles(pg_server: PgServer, database_url: str) -> Iterator[Roles]:
    with made_roles(pg_server, database_url) as made:
        yield made


@pytest.mark.parametrize("kind", list(FILES))
def test_each_statement_a_role_runs_is_planned_as_that_role_without_a_privilege_error(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    grant_all(database_url, roles, capsys)
    queries = queries_for(SCHEMA)
    explained, refused = [], []
    with psycopg.connect(roles.urls[kind], autocommit=True) as conn:
        for name in statements(kind):
            statement = queries[name]
            if not _EXPLAINED.match(statement.text):
                continue  # LISTEN, SET: no table
            params = dict.fromkeys(re.findall(r"%\((\w+)\)s", statement.text))
            try:
                with conn.transaction(force_rollback=True):
                    conn.execute(b"EXPLAIN " + statement.query, params)
            except psycopg.errors.InsufficientPrivilege as error:
                refused.append((name, error.diag.message_primary))
            explained.append(name)
    assert refused == []
    assert len(explained) > len(FILES[kind])  # every file has statements to explain


@pytest.mark.parametrize("kind", list(FILES))
def test_the_sequences_a_role_takes_ids_from_are_granted_to_it(kind: str) -> None:
    queries = queries_for(SCHEMA)
    taken = {
        (name, sequence)
        for name in statements(kind)
        for sequence in _NEXTVAL.findall(queries[name].text)
    }
    assert {sequence for _, sequence in taken} <= set(SEQUENCES)
    assert [(name, s) for name, s in sorted(taken) if not holds(kind, s, "USAGE")] == []
    if kind != "dispatcher":  # enqueue, publish, replay of an event, a test event
        assert taken
