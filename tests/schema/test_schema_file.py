"""``sql/schema.sql`` is the schema the migrations make, with the grants of
``outbox roles``: the dump of a freshly migrated database, rendered by
``tests/schema_file.py``, equals the committed file.

The file is PostgreSQL 18's rendering (pg_dump and the server's own deparsing of
each object): it is compared on a server of that version alone.
"""

from __future__ import annotations

import pytest

from tests import schema_file, servers
from tests.conftest import PgServer


def test_the_committed_schema_file_is_the_schema_a_fresh_migrate_leaves(
    pg_server: PgServer, database_url: str
) -> None:
    if pg_server.version != servers.embedded_version():
        pytest.skip(
            f"sql/schema.sql is PostgreSQL {servers.embedded_version()}'s rendering; "
            f"this server is {pg_server.version}"
        )
    generated = schema_file.generate(pg_server.url, database_url)
    committed = schema_file.PATH.read_text("utf-8") if schema_file.PATH.exists() else ""
    if generated != committed:
        pytest.fail(schema_file.stale(committed, generated), pytrace=False)
