"""A pytest plugin that loads the SQL from a copy: ``-p tests.mutation.sql_copy``
with ``OUTBOX_SQL_COPY`` naming a directory laid out as ``sql/`` (``queries/``,
``migrations/``).

``outbox._queries.sql_dir`` answers that directory for the whole run, so every
statement (and the migrated template) comes from the copy; nothing in the
working tree changes. Without ``OUTBOX_SQL_COPY`` the plugin does nothing. It
patches this process only: a test that starts a dispatcher process of its own
loads the real files there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import outbox
import outbox._queries
import outbox.migrations

ENV = "OUTBOX_SQL_COPY"

_patch = pytest.MonkeyPatch()


def _point_at(directory: Path) -> None:
    if not (directory / "queries").is_dir() or not (directory / "migrations").is_dir():
        raise pytest.UsageError(f"{ENV}={directory} has no queries/ and migrations/")
    _patch.setattr(outbox._queries, "sql_dir", lambda: directory)
    _patch.setattr(outbox.migrations, "sql_dir", lambda: directory)
    outbox._queries._sources.cache_clear()
    outbox._queries.queries_for.cache_clear()


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
    outbox._queries._sources.cache_clear()
    outbox._queries.queries_for.cache_clear()
