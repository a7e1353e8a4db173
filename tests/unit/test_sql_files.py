"""The named statements of ``sql/queries/``: how files are read and names kept unique."""

from __future__ import annotations

from pathlib import Path

import pytest

from outbox._queries import catalog, collect, parse, queries_for, sql_dir
from outbox.errors import OutboxError


def test_statements_are_split_at_their_name_headers() -> None:
    text = "-- a preamble\n\n-- name: one\nSELECT 1\n\n-- name: two\n-- why\nSELECT 2\n"
    assert parse("f", text) == {"one": "SELECT 1", "two": "SELECT 2"}


def test_the_driver_gets_statements_without_their_comments() -> None:
    text = (
        "-- name: one\n-- why it is written so\nSELECT '--', 'it''s -- text'  -- a note\n"
        "\n  -- indented\nFROM t -- end\n"
    )
    assert parse("f", text) == {"one": "SELECT '--', 'it''s -- text'\nFROM t"}


def test_what_a_business_transaction_runs_is_short_enough_for_the_drivers_cache() -> None:
    # psycopg parses the placeholders of a statement longer than 4 KiB again on
    # every execution (psycopg._queries.MAX_CACHED_STATEMENT_LENGTH)
    queries = queries_for("outbox")
    long = [n for n in queries.names("enqueue") if len(queries[n].query) > 4096]
    assert long == []


def test_a_fragment_is_written_into_the_statements_after_it_word_for_word() -> None:
    text = (
        "-- fragment: due\nm.state = 'ready' AND m.at <= now()\n"
        "-- fragment: due_now\n{due} AND m.x\n"
        "-- name: one\nSELECT 1 FROM {schema}.m WHERE {due_now}\n"
        "-- name: two\nSELECT 2 WHERE {due} AND {unknown}\n"
    )
    assert parse("f", text) == {
        "one": "SELECT 1 FROM {schema}.m WHERE m.state = 'ready' AND m.at <= now() AND m.x",
        "two": "SELECT 2 WHERE m.state = 'ready' AND m.at <= now() AND {unknown}",
    }
    with pytest.raises(OutboxError, match=r"f: fragment 'due' is named twice"):
        parse("f", "-- fragment: due\nTRUE\n-- fragment: due\nFALSE\n")


def test_a_header_that_is_not_a_plain_name_is_an_error() -> None:
    with pytest.raises(OutboxError, match=r"f: 'bad-name' is not a statement name"):
        parse("f", "-- name: bad-name\nSELECT 1\n")


def test_a_name_given_twice_in_one_file_is_an_error() -> None:
    with pytest.raises(OutboxError, match=r"f: statement 'one' is named twice"):
        parse("f", "-- name: one\nSELECT 1\n-- name: one\nSELECT 2\n")


def test_a_name_given_in_two_files_is_an_error() -> None:
    with pytest.raises(OutboxError, match=r"'one' is named in both a and b"):
        collect({"a": "-- name: one\nSELECT 1\n", "b": "-- name: one\nSELECT 2\n"})


def test_the_notify_twin_of_a_statement_is_a_name_of_its_own() -> None:
    files = {"a": "-- name: send\nSELECT 1{notify}\n", "b": "-- name: send_notify\nSELECT 2\n"}
    with pytest.raises(OutboxError, match=r"'send_notify' is named in both a and b"):
        collect(files)
    assert set(collect({"a": files["a"]})) == {"send", "send_notify"}


def test_every_file_is_loaded_and_bound_to_the_schema() -> None:
    queries = queries_for("some_schema")
    files = {path.stem for path in (sql_dir() / "queries").glob("*.sql")}
    assert files >= {"enqueue", "endpoints", "admin", "migrate"}
    assert set(queries.files()) == files
    for file in files:
        assert queries.names(file)
    assert '"some_schema".messages' in queries["enqueue"].text
    assert "pg_notify('some_schema_ready', '')" in queries["enqueue_notify"].text
    assert "pg_notify(" not in queries["enqueue"].text


def test_a_catalog_holds_the_statements_of_the_files_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.sql").write_text("-- name: one\nSELECT 1 FROM {schema}.t{notify}\n")
    (tmp_path / "a" / "two.sql").write_text("-- name: two\nLISTEN {channel}\n")
    (tmp_path / "b.sql").write_text("-- name: three\nSELECT 3\n")
    (tmp_path / "a.txt").write_text("-- name: not_sql\nSELECT 4\n")
    queries = catalog("tenant", (tmp_path / "a", tmp_path / "b.sql"))
    assert queries.names() == ["one", "one_notify", "two", "three"]
    assert queries.files() == ["one", "two", "b"]
    assert queries["one"].text == 'SELECT 1 FROM "tenant".t'
    assert "pg_notify('tenant_ready', '')" in queries["one_notify"].text
    assert queries["two"].text == 'LISTEN "tenant_ready"'
    assert queries.wake_lock == queries_for("tenant").wake_lock
    assert catalog("tenant", (tmp_path / "a", tmp_path / "b.sql")) is queries
    assert "enqueue" not in queries and "enqueue" in queries_for("tenant")


def test_names_are_unique_within_a_catalog_and_its_files_named_once(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.sql").write_text("-- name: enqueue\nSELECT 1\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "one.sql").write_text("-- name: other\nSELECT 2\n")
    (tmp_path / "c.sql").write_text("-- name: enqueue\nSELECT 3\n")
    # another catalog may use a name of the library's
    assert catalog("outbox", (tmp_path / "a",))["enqueue"].text == "SELECT 1"
    with pytest.raises(OutboxError, match=r"'enqueue' is named in both one and c"):
        catalog("outbox", (tmp_path / "a", tmp_path / "c.sql"))
    with pytest.raises(OutboxError, match=r"two statement files are named one\.sql"):
        catalog("outbox", (tmp_path / "a", tmp_path / "b"))
    with pytest.raises(OutboxError, match=r"no SQL files found in .*missing"):
        catalog("outbox", (tmp_path / "missing",))
