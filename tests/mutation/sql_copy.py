"""A pytest plugin that loads the SQL from a copy: ``-p tests.mutation.sql_copy``
with ``OUTBOX_SQL_COPY`` naming a copy of the tree that holds its ``.sql`` files:
``sql/`` (``queries/``, ``migrations/``) and the runtime's, in its packages
(``dispatchers/store/sql/``, ``dispatchers/store/web/sql/``,
``dispatchers/bench/queries.sql``, ``dispatchers/demo.sql``).

``outbox._queries.sql_dir`` answers the copy's ``sql/`` for the whole run, and
every other file the loader is given (the runtime's catalogs name theirs beside
their modules) is read at the same place in the copy, so every statement (and
the migrated template) comes from the copy; nothing in the working tree
changes. Without ``OUTBOX_SQL_COPY`` the plugin does nothing. It patches this
process only: a test that starts a dispatcher process of its own loads the real
files there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import outbox
import outbox._queries
import outbox.migrations

ENV = "OUTBOX_SQL_COPY"
TREE = Path(outbox.__file__).resolve().parents[1]
"""The tree whose files the runtime's catalogs name (the one ``outbox`` is imported from)."""
REQUIRED = ("sql/queries", "sql/migrations", "dispatchers/store/sql")

_patch = pytest.MonkeyPatch()
_sources = outbox._queries._sources


def _in_copy(path: Path, copy: Path) -> Path:
    """``path``, a file or directory of the tree, at its place in ``copy``."""
    try:
        return copy / path.resolve().relative_to(TREE)
    except ValueError:  # outside the tree: the copy's sql/ already
        return path


def _clear() -> None:
    _sources.cache_clear()
    outbox._queries.catalog.cache_clear()
    outbox._queries.queries_for.cache_clear()


def _point_at(copy: Path) -> None:
    missing = [part for part in REQUIRED if not (copy / part).is_dir()]
    if missing:
        raise pytest.UsageError(f"{ENV}={copy} has no {', '.join(missing)}")

    def copied(paths: tuple[Path, ...]) -> dict[str, outbox._queries._Source]:
        return _sources(tuple(_in_copy(path, copy) for path in paths))

    _patch.setattr(outbox._queries, "sql_dir", lambda: copy / "sql")
    _patch.setattr(outbox.migrations, "sql_dir", lambda: copy / "sql")
    _patch.setattr(outbox._queries, "_sources", copied)
    _clear()


def pytest_configure(config: pytest.Config) -> None:
    copy = os.environ.get(ENV)
    if copy:
        _point_at(Path(copy).resolve())


def pytest_report_header(config: pytest.Config) -> str | None:
    copy = os.environ.get(ENV)
    if not copy:
        return None
    return f"SQL loaded from {copy}; outbox imported from {Path(outbox.__file__).parent}"


def pytest_unconfigure(config: pytest.Config) -> None:
    _patch.undo()
    _clear()
