"""Migrations 0030 to 0032 on an outbox that has a history: the tables become
partitions of the new ones without a row copied or lost, completions go on while
the migrations run (their longest stall measured), a run stopped at any step
resumes from the step it stopped at, and the legacy partition goes whole once it
is past the retention period, its keys with their generation (migration 0033)."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from dispatchers.runtime.log import NullLog
from dispatchers.runtime.maintenance import Partitions
from dispatchers.runtime.reporting import Reporter
from dispatchers.store.postgres import Store
from outbox import Outbox
from outbox.migrations import applied_versions, load_migrations, migrate
from tests.dispatching import fast_config
from tests.store.test_partitions import DAY, add_history

MIGRATIONS = load_migrations()
BEFORE = [m for m in MIGRATIONS if m.version < 30]

HISTORY = """
INSERT INTO outbox.delivered (id, idempotency_key, target, endpoint_id, url, method, headers,
                              body, content_type, attempts, max_attempts, created_at,
                              completed_at)
SELECT g, 'old-' || g, 'https://example.com', NULL, 'https://example.com', 'POST', '{}',
       '\\x7b7d', 'application/json', 1, 5, now() - interval '6 days',
       now() - interval '6 days' + g * interval '400 ms'
FROM generate_series(1, %(rows)s) AS g;
INSERT INTO outbox.message_keys (target, idempotency_key, message_id, created_at)
SELECT 'https://example.com', 'old-' || g, g, now() - interval '6 days'
FROM generate_series(1, %(rows)s) AS g;
INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)
SELECT g, 1, 'someone', now() - interval '6 days' + g * interval '400 ms', 'delivered'
FROM generate_series(1, %(rows)s) AS g
"""

COMPLETE = """
WITH history AS (
    INSERT INTO outbox.delivered (id, idempotency_key, target, url, method, headers, body,
                                  content_type, attempts, max_attempts, created_at, completed_at)
    VALUES (%(id)s, 'new-' || %(id)s, 'https://example.com', 'https://example.com', 'POST',
            '{}', '', 'text/plain', 1, 5, now(), now())
)
INSERT INTO outbox.attempts (message_id, attempt, owner, started_at, outcome)
VALUES (%(id)s, 1, 'writer', now(), 'delivered')
"""


def load(url: str, rows: int) -> None:
    migrate(url, migrations=BEFORE)
    with psycopg.connect(url) as conn:
        for statement in HISTORY.strip().split(";\n"):
            conn.execute(statement, {"rows": rows})
        conn.execute("ANALYZE outbox.delivered, outbox.attempts")


class Completions(threading.Thread):
    """Writes a delivered row and its attempt per transaction, as completions do,
    until stopped; keeps the time of each commit."""

    def __init__(self, url: str, first: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.next = first
        self.commits: list[float] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stop.is_set():
                    conn.execute(COMPLETE, {"id": self.next})
                    self.next += 1
                    self.commits.append(time.monotonic())
        except BaseException as exc:  # the test reports it
            self.errors.append(exc)

    def wait_for(self, commits: int, within: float = 30.0) -> None:
        """Return once ``commits`` completions are committed; fail after ``within`` s."""
        deadline = time.monotonic() + within
        while len(self.commits) < commits:
            assert not self.errors, self.errors
            assert time.monotonic() < deadline, f"{len(self.commits)} of {commits} commits"
            time.sleep(0.01)

    def longest_gap(self, start: float, end: float) -> float:
        during = [t for t in self.commits if start <= t <= end]
        return max((b - a for a, b in itertools.pairwise(during)), default=end - start)


def counts(url: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM outbox.delivered),"
            " (SELECT count(*) FROM outbox.attempts),"
            " (SELECT count(DISTINCT id) FROM outbox.delivered),"
            " (SELECT count(*) FROM outbox.delivered_legacy),"
            " (SELECT count(*) FROM outbox.attempts_legacy)"
        ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.slow
def test_a_large_history_becomes_a_partition_while_completions_go_on(
    empty_database_url: str,
) -> None:
    rows = 200_000
    load(empty_database_url, rows)
    with psycopg.connect(empty_database_url) as conn:
        indexes_before = dict(
            conn.execute(
                "SELECT c.relname, c.relfilenode FROM pg_index AS i"
                " JOIN pg_class AS c ON c.oid = i.indexrelid"
                " WHERE i.indrelid IN (CAST('outbox.delivered' AS regclass),"
                "                      CAST('outbox.attempts' AS regclass))"
            ).fetchall()
        )
    writer = Completions(empty_database_url, first=10_000_001)
    writer.start()
    try:
        writer.wait_for(20)  # completions running before the migrations
        start = time.monotonic()
        applied = migrate(empty_database_url)
        end = time.monotonic()
        writer.wait_for(len(writer.commits) + 20)  # and after them
    finally:
        writer.stop.set()
        writer.join(10)
    assert writer.errors == []
    assert [m.version for m in applied] == [m.version for m in MIGRATIONS if m.version >= 30]
    written = writer.next - 10_000_001
    assert written > 100

    # nothing lost, nothing twice; the old rows are the legacy partitions', the
    # new ones before the cutover too
    assert counts(empty_database_url) == (
        rows + written,
        rows + written,
        rows + written,
        rows + written,
        rows + written,
    )
    # completions went on: the longest stall is a lock wait of the swap or of
    # 0030 (half a second at most per try) and their catalog work
    gap = writer.longest_gap(start, end)
    print(f"migrations 0030-0032 on {rows} rows: {end - start:.2f} s, longest stall {gap:.3f} s")
    assert gap < 1.5
    # the old indexes were adopted, not built again (same files)
    with psycopg.connect(empty_database_url) as conn:
        indexes_after = dict(
            conn.execute(
                "SELECT c.relname, c.relfilenode FROM pg_index AS i"
                " JOIN pg_class AS c ON c.oid = i.indexrelid"
                " WHERE i.indrelid IN (CAST('outbox.delivered_legacy' AS regclass),"
                "                      CAST('outbox.attempts_legacy' AS regclass))"
            ).fetchall()
        )
        parents = conn.execute(
            "SELECT count(*) FROM pg_inherits"
            " WHERE inhrelid IN (SELECT oid FROM pg_class WHERE relname LIKE '%%legacy%%idx')"
        ).fetchone()
    renamed = {
        name.replace("delivered_", "delivered_legacy_", 1)
        if name.startswith("delivered_")
        else name.replace("attempts_", "attempts_legacy_", 1): node
        for name, node in indexes_before.items()
    }
    assert indexes_after == renamed
    assert parents == (5,)  # each index but the primary keys belongs to its parent's


def test_a_run_stopped_at_any_step_resumes_where_it_stopped(empty_database_url: str) -> None:
    load(empty_database_url, 1000)
    migrate(empty_database_url, migrations=[m for m in MIGRATIONS if m.version <= 30])
    assert applied_versions(empty_database_url)[-1] == 30
    migrate(empty_database_url, migrations=[m for m in MIGRATIONS if m.version <= 31])
    # a swap that fails is rolled back whole: here, a name it needs is taken
    with psycopg.connect(empty_database_url) as conn:
        conn.execute("CREATE TABLE outbox.delivered_legacy (id int)")
    with pytest.raises(Exception, match="0032"):
        migrate(empty_database_url)
    assert applied_versions(empty_database_url)[-1] == 31
    with psycopg.connect(empty_database_url) as conn:
        conn.execute("DROP TABLE outbox.delivered_legacy")
        conn.execute(COMPLETE, {"id": 5000})  # completions went on in between
    migrate(empty_database_url)
    assert applied_versions(empty_database_url) == [m.version for m in MIGRATIONS]
    assert counts(empty_database_url) == (1001, 1001, 1001, 1001, 1001)
    with psycopg.connect(empty_database_url) as conn:
        partitions = conn.execute(
            "SELECT partition, lower IS NULL, is_default FROM outbox.history_partitions()"
            " WHERE parent = 'delivered'"
        ).fetchall()
    assert partitions[0] == ("delivered_legacy", True, False)
    assert ("delivered_default", True, True) in partitions
    assert len(partitions) >= 4  # the legacy one, days from the cutover, the default one


async def test_the_legacy_partition_goes_whole_and_its_keys_with_their_generation(
    empty_database_url: str,
) -> None:
    url = empty_database_url
    load(url, 3000)  # completed six days ago, over 20 minutes
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        (cutover,) = conn.execute(
            "SELECT upper FROM outbox.history_partitions() WHERE partition = 'delivered_legacy'"
        ).fetchone() or (None,)
        assert cutover is not None
        # fifty messages delivered after the cutover, in the first day's partition
        add_history(url, 100_001, 100_050, cutover + timedelta(hours=1))
        # The legacy partition ends at the cutover, two days ahead: it would be
        # past a retention of five days a week from now. Its bound is moved back
        # to where it would be then, relative to now: below it only its own rows,
        # above it the default partition until the cutover.
        since = datetime.now(UTC) - timedelta(days=5, hours=1)
        for parent in ("delivered", "attempts"):
            conn.execute(f"ALTER TABLE outbox.{parent} DETACH PARTITION outbox.{parent}_legacy")
            conn.execute(
                sql.SQL(
                    "ALTER TABLE outbox.{} ATTACH PARTITION outbox.{}"
                    " FOR VALUES FROM (MINVALUE) TO ({})"
                ).format(
                    sql.Identifier(parent), sql.Identifier(f"{parent}_legacy"), sql.Literal(since)
                )
            )
    store = Store(url, fast_config(retention=5 * DAY))
    await store.open()
    try:
        partitions = Partitions(
            store,
            Reporter(NullLog()),
            interval=60.0,
            retention=5 * DAY,
            ahead=3 * DAY,
            step="day",
            batch=500,
            batches=2,
            pause=0.0,
        )
        dropped = await partitions.run_once()
        assert sorted(dropped) == ["attempts_legacy", "delivered_legacy"]
        with psycopg.connect(url) as conn:
            left = conn.execute(
                "SELECT (SELECT count(*) FROM outbox.delivered),"
                " (SELECT count(*) FROM outbox.attempts),"
                " (SELECT count(*) FROM outbox.message_keys),"
                " to_regclass('outbox.delivered_legacy'), to_regclass('outbox.attempts_legacy')"
            ).fetchone()
            # a key outlives its history: the legacy keys are in the current generation
            again = Outbox().enqueue(
                conn, url="https://example.com", idempotency_key="old-7", json={}
            )
        assert left == (50, 50, 3050, None, None)
        assert again == 7
        # two turns a retention period apart: the keys of the converted outbox
        # become the previous generation, then go whole
        for turn in (2, 3):
            with psycopg.connect(url) as conn:
                conn.execute(
                    "UPDATE outbox.key_generation SET carried_at = now() - interval '6 days'"
                )
            await partitions.run_once()
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT generation FROM outbox.key_generation").fetchone() == (
                    turn,
                )
    finally:
        await store.close()
    with psycopg.connect(url) as conn:
        keys = conn.execute(
            "SELECT (SELECT count(*) FROM outbox.message_keys),"
            " (SELECT count(*) FROM outbox.message_keys_old)"
        ).fetchone()
        reused = Outbox().enqueue(conn, url="https://example.com", idempotency_key="old-7", json={})
    # no message was left in the outbox to carry a key for: every key went, and
    # a legacy key is new again
    assert keys == (0, 0)
    assert reused not in (7, None)
