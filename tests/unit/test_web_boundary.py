"""The web surfaces (the management API, the dashboard, the consumer portal)
read through one boundary, :mod:`dispatchers.store.web`: none of their modules
names a statement of any catalog or loads one, and the portal takes from the
dashboard only what it shares on purpose (its application, connections and
field checks), never its pages."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import dispatchers
from dispatchers.bench.env import bench_queries
from dispatchers.demo import demo_queries
from dispatchers.store.statements import store_queries, web_queries
from outbox._queries import queries_for

ROOT = Path(dispatchers.__file__).parent

SURFACES = ("api", "ui", "portal")
"""The packages of the web surfaces under ``dispatchers``."""

NOT_A_STATEMENT = {"log_action", "audit"}
"""Calls whose string arguments name an action, some of which are words that
also name statements (``replay``, ``endpoint_delete``): what is logged, not run."""

LOADERS = {"queries_for", "catalog", "rows_plan", "run_sync", "store_queries", "web_queries"}
"""What runs or loads a statement by its name."""

PORTAL_MAY_USE = {"dispatchers.ui.app", "dispatchers.ui.dashboard", "dispatchers.ui.fields"}
"""What the portal takes from the dashboard: the application it mounts on, the
connections, keys and rendering every request shares, and the field checks."""


def statement_names() -> set[str]:
    """The name of every statement of every catalog: the library's, the
    dispatcher's, the web surfaces', the bench's and the demo's."""
    return (
        set(queries_for("outbox").names())
        | set(store_queries("outbox").names())
        | set(web_queries("outbox").names())
        | set(bench_queries("outbox"))
        | set(demo_queries("outbox").names())
    )


def modules(*packages: str) -> Iterator[tuple[str, ast.Module]]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT.parent).as_posix(), ast.parse(path.read_text("utf-8"))


def _callee(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def spelled(tree: ast.Module, names: set[str]) -> list[tuple[int, str]]:
    """The statement names ``tree`` spells where a statement is named: as a key
    (``queries["name"]``) or as an argument of a call, but the calls of
    :data:`NOT_A_STATEMENT`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            keys = [node.slice]
        elif isinstance(node, ast.Call) and _callee(node) not in NOT_A_STATEMENT:
            keys = [*node.args, *(k.value for k in node.keywords)]
        else:
            continue
        found += [
            (key.lineno, key.value)
            for key in keys
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value in names
        ]
    return found


def imported(tree: ast.Module) -> Iterator[tuple[str, str]]:
    """(module, name) of each ``from module import name`` of ``tree``, and
    (module, "") of each ``import module``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield from ((node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from ((alias.name, "") for alias in node.names)


def test_the_catalogs_name_their_statements() -> None:
    names = statement_names()
    assert {"enqueue", "claim", "web_endpoint_page", "web_messages", "web_token_find"} <= names


@pytest.mark.parametrize("package", SURFACES)
def test_no_module_of_a_web_surface_spells_a_statement_name(package: str) -> None:
    names = statement_names()
    found = {path: hits for path, tree in modules(package) if (hits := spelled(tree, names))}
    assert found == {}


def test_the_check_finds_a_statement_named_as_a_handler_would_name_it() -> None:
    names = statement_names()
    handler = ast.parse(
        'rows(conn, schema, "web_endpoint_page", params, Row)\n'
        'queries_for(schema)["endpoint_get"]\n'
        'log_action(dashboard, "endpoint_delete", 1)\n'
        'TAG = "retention"\n'
    )
    assert spelled(handler, names) == [(1, "web_endpoint_page"), (2, "endpoint_get")]


@pytest.mark.parametrize("package", SURFACES)
def test_no_module_of_a_web_surface_loads_or_runs_a_statement_itself(package: str) -> None:
    found = [
        (path, module, name)
        for path, tree in modules(package)
        for module, name in imported(tree)
        if name in LOADERS or module in ("outbox._queries", "dispatchers.store.statements")
    ]
    assert found == []


def test_no_statement_catalog_is_left_in_a_web_surface() -> None:
    assert [p for package in SURFACES for p in (ROOT / package).rglob("*.sql")] == []


def test_the_portal_takes_from_the_dashboard_only_what_it_shares() -> None:
    taken = {
        (path, module)
        for path, tree in modules("portal")
        for module, _ in imported(tree)
        if module == "dispatchers.ui" or module.startswith("dispatchers.ui.")
    }
    assert taken and {m for _, m in taken} <= PORTAL_MAY_USE, sorted(taken)


def test_the_surfaces_read_endpoints_messages_and_attempts_through_the_store() -> None:
    # each of the three reads through dispatchers.store.web, and none defines a
    # row class of its own for what the store shows
    used = {
        package: {
            module
            for _, tree in modules(package)
            for module, _ in imported(tree)
            if module.startswith("dispatchers.store.web")
        }
        for package in SURFACES
    }
    assert all(used.values()), used
    rows = {
        (path, node.name)
        for path, tree in modules(*SURFACES)
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(getattr(base, "id", "") == "NamedTuple" for base in node.bases)
        and node.name.endswith(("Endpoint", "Attempt", "Found", "Delivery", "View"))
    }
    assert rows == set()
