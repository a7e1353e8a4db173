"""The named statements: how files are read and names kept unique, and which
catalog holds which (the library's ``sql/queries/``, the runtime's own)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dispatchers.bench.env import bench_queries
from dispatchers.demo import demo_queries
from dispatchers.store.statements import SQL_DIR, WEB_SQL_DIR, store_queries, web_queries
from outbox._queries import catalog, collect, parse, queries_for, sql_dir
from outbox.errors import OutboxError

DISPATCHER_CODE = ("store", "runtime", "delivery")
"""The packages of the dispatcher's code under ``dispatchers``."""

FROM_THE_LIBRARY = {"migrations_applied"}
"""The library's statements the dispatcher runs (its preflight checks the version)."""


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


def test_the_dispatchers_statements_are_bound_to_the_schema_and_its_channel() -> None:
    queries = store_queries("some_schema")
    files = {path.stem for path in SQL_DIR.glob("*.sql")}
    assert files == {
        "claim", "complete", "leases", "retention", "health", "session", "preflight", "alerts"
    }  # fmt: skip
    assert set(queries.files()) == files
    assert '"some_schema".messages' in queries["claim"].text
    assert queries["waker_listen"].text == 'LISTEN "some_schema_ready"'
    assert queries.wake_lock == queries_for("some_schema").wake_lock
    assert store_queries("some_schema") is store_queries("some_schema")  # cached


def runtime_catalogs(schema: str) -> dict[str, set[str]]:
    """The statement names of each of the runtime's catalogs."""
    return {
        "store": set(store_queries(schema).names()),
        "web": set(web_queries(schema).names()),
        "bench": set(bench_queries(schema)),
        "demo": set(demo_queries(schema).names()),
    }


def test_the_library_loads_none_of_the_runtimes_statements() -> None:
    library = set(queries_for("outbox").names())
    runtime = runtime_catalogs("outbox")
    assert all(runtime.values())
    for name, names in runtime.items():
        assert library.isdisjoint(names), (name, library & names)
    assert "claim" not in queries_for("outbox")
    assert not [n for n in library if n.startswith(("ui_", "demo_", "waker_", "health_"))]
    # and no runtime catalog holds another's
    everything = [n for names in runtime.values() for n in names]
    assert len(everything) == len(set(everything))


WEB = Path("store", "web")
"""The web surfaces' reads, under the store's package but not the dispatcher's code."""


def _literals(package: str | Path, *, leaving: Path | None = None) -> set[str]:
    """Every string constant of the Python code of ``dispatchers/<package>``
    (but that of ``dispatchers/<leaving>``)."""
    root = SQL_DIR.parents[1] / package
    left = None if leaving is None else SQL_DIR.parents[1] / leaving
    return {
        node.value
        for path in root.rglob("*.py")
        if left is None or not path.is_relative_to(left)
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_the_stores_catalog_holds_every_statement_the_dispatcher_names() -> None:
    # A string of the dispatcher's code that names a statement of any catalog
    # names one of the store's (or one it takes from the library), and every
    # statement of the store's is named there: none left behind in another
    # catalog, none loaded that nothing runs.
    store = store_queries("outbox")
    other = runtime_catalogs("outbox")
    named = set().union(*(_literals(package, leaving=WEB) for package in DISPATCHER_CODE))
    statements = set(queries_for("outbox").names()).union(*other.values())
    # "statement_timeout": a setting the dispatcher names, and a bench statement
    found = (named & statements) - {"statement_timeout"}
    assert found - set(store.names()) == FROM_THE_LIBRARY
    assert set(store.names()) <= named
    assert {"claim", "claim_uncapped", "claim_lone", "complete", "renew", "rescue"} <= found


def test_the_web_catalog_holds_one_file_per_resource_and_only_what_the_surfaces_read() -> None:
    # the web surfaces' statements are a catalog of their own, beside the
    # dispatcher's: every statement of it is named by dispatchers.store.web,
    # and what dispatchers.store.web names of any catalog is in it (or is the
    # library's endpoint_get, the operator's whole row of an endpoint)
    web = web_queries("some_schema")
    files = {path.stem for path in WEB_SQL_DIR.glob("*.sql")}
    assert files == {"endpoints", "messages", "attempts", "activity", "tokens"}
    assert set(web.files()) == files
    assert '"some_schema".endpoints' in web["web_endpoint_page"].text
    assert all(name.startswith("web_") for name in web.names())
    named = _literals(WEB)
    statements = set(queries_for("outbox").names()).union(*runtime_catalogs("outbox").values())
    assert (named & statements) - set(web.names()) == {"endpoint_get"}
    assert set(web.names()) <= named
    assert web_queries("some_schema") is web
