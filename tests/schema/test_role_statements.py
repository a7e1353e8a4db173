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
from collections.abc import Callable, Iterator

import psycopg
import pytest

from dispatchers.store.statements import store_queries, web_queries
from outbox._queries import Queries, Statement, queries_for
from outbox.roles import SEQUENCES, holds
from tests.conftest import PgServer
from tests.schema.test_roles import Roles, grant_all, made_roles

SCHEMA = "outbox"

#: the files of the library's statements (sql/queries) each role's code runs
FILES: dict[str, tuple[str, ...]] = {
    # the library in the application's transaction: enqueue and publish
    "producer": ("enqueue",),
    # outbox dispatch checks the schema's version (and runs its own, below)
    "dispatcher": (),
    # the admin commands (and the dashboard, below; it reads tenants too)
    "operator": ("admin", "endpoints", "destinations", "event_types", "slots", "tenants"),
}
ALSO = {"dispatcher": ("migrations_applied",)}
#: the runtime's catalogs each role's code runs whole: outbox dispatch, its
#: preflight and its waker; the web surfaces (the dashboard, the API, the portal)
RUNTIME: dict[str, Callable[[str], Queries]] = {
    "dispatcher": store_queries,
    "operator": web_queries,
}

_EXPLAINED = re.compile(r"^\s*(SELECT|WITH|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)
_NEXTVAL = re.compile(r"""nextval\('"?\w+"?\.(\w+)'\)""")


def statements(kind: str) -> list[Statement]:
    library = queries_for(SCHEMA)
    names = [name for file in FILES[kind] for name in library.names(file)]
    found = [library[name] for name in names + list(ALSO.get(kind, ()))]
    if kind in RUNTIME:
        runtime = RUNTIME[kind](SCHEMA)
        found += [runtime[name] for name in runtime.names()]
    return found


def files(kind: str) -> int:
    """How many statement files the role's code runs statements of."""
    runtime = len(RUNTIME[kind](SCHEMA).files()) if kind in RUNTIME else 0
    return len(FILES[kind]) + runtime


@pytest.fixture
def roles(pg_server: PgServer, database_url: str) -> Iterator[Roles]:
    with made_roles(pg_server, database_url) as made:
        yield made


@pytest.mark.parametrize("kind", list(FILES))
def test_each_statement_a_role_runs_is_planned_as_that_role_without_a_privilege_error(
    database_url: str, roles: Roles, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    grant_all(database_url, roles, capsys)
    explained, refused = [], []
    with psycopg.connect(roles.urls[kind], autocommit=True) as conn:
        for statement in statements(kind):
            name = statement.name
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
    assert len(explained) > files(kind)  # every file has statements to explain


@pytest.mark.parametrize("kind", list(FILES))
def test_the_sequences_a_role_takes_ids_from_are_granted_to_it(kind: str) -> None:
    taken = {
        (statement.name, sequence)
        for statement in statements(kind)
        for sequence in _NEXTVAL.findall(statement.text)
    }
    assert {sequence for _, sequence in taken} <= set(SEQUENCES)
    assert [(name, s) for name, s in sorted(taken) if not holds(kind, s, "USAGE")] == []
    if kind != "dispatcher":  # enqueue, publish, replay of an event, a test event
        assert taken
