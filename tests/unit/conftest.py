"""The unit tier: pure logic, no database, no network.

A unit test that asks for one of the database fixtures of ``tests/conftest.py``
fails at setup: it belongs with the tests of its subject (``tests/library``, ``tests/api``...).
"""

from __future__ import annotations

import pytest

DATABASE_FIXTURES = frozenset(
    {"pg_server", "server_pool", "template_url", "database_url", "empty_database_url", "tx"}
)


def pytest_runtest_setup(item: pytest.Item) -> None:
    used = DATABASE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if used:
        pytest.fail(
            f"a unit test must not use the database ({', '.join(sorted(used))}): "
            "move it to the tests of its subject (tests/library, tests/api...)",
            pytrace=False,
        )
