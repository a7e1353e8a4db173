"""The dispatcher's typed rows (``dispatchers.store.rows``) take their columns by name from
real results, in whatever order the statement returns them, and a result that
lacks one fails naming it."""

from __future__ import annotations

from typing import NamedTuple

import psycopg
import pytest

from dispatchers.store.rows import named_row, result_names


class Pair(NamedTuple):
    id: int
    state: str


def test_columns_are_taken_by_name_whatever_their_order(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        in_order = conn.cursor(row_factory=named_row(Pair))
        assert in_order.execute("SELECT 1 AS id, 'ready' AS state").fetchall() == [Pair(1, "ready")]
        reversed_ = conn.cursor(row_factory=named_row(Pair))
        rows = reversed_.execute(
            "SELECT 'dead' AS state, 7 AS extra, 2 AS id UNION ALL SELECT 'ready', 8, 3"
        ).fetchall()
        assert rows == [Pair(2, "dead"), Pair(3, "ready")]


def test_each_result_of_a_message_is_read_by_its_own_names(database_url: str) -> None:
    # as the dispatcher sends its statements: set_config first, in the same message
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = psycopg.ClientCursor(conn, row_factory=named_row(Pair))
        cur.execute(
            "SELECT set_config('statement_timeout', '5s', true) AS timeout;"
            " SELECT 'delivered' AS state, 4 AS id"
        )
        assert result_names(cur) == ("timeout",)
        assert cur.nextset()
        assert result_names(cur) == ("state", "id")
        assert cur.fetchall() == [Pair(4, "delivered")]


def test_a_result_without_a_field_fails_naming_it(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        cur = conn.cursor(row_factory=named_row(Pair))
        with pytest.raises(LookupError, match=r"no column state \(it has \('id', 'other'\)\)"):
            cur.execute("SELECT 1 AS id, 2 AS other").fetchall()


def test_a_statement_without_a_result_has_no_names(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = conn.cursor()
        assert result_names(cur) == ()  # nothing executed yet
        cur.execute("SET LOCAL statement_timeout = '5s'")
        assert result_names(cur) == ()
