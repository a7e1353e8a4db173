"""How ``tests/schema_file.py`` tidies a dump: the daily partitions of the history
left out, their parents kept, the run's roles renamed, no psql command, and no
date of the day the schema was migrated."""

from __future__ import annotations

import datetime

import pytest

from tests import schema_file


def dump(*objects: tuple[str, str, str]) -> str:
    """A dump as pg_dump prints it: a heading per object, then its statements."""
    return "".join(
        f"--\n-- Name: {name}; Type: {kind}; Schema: outbox; Owner: -\n--\n\n{text}\n\n\n"
        for name, kind, text in objects
    )


def test_the_daily_partitions_are_left_out_and_the_partitioned_tables_kept() -> None:
    text = schema_file.render(
        "\\restrict abc\nSET lock_timeout = 0;\n\n"
        + dump(
            ("delivered", "TABLE", "CREATE TABLE outbox.delivered ();"),
            ("delivered_default", "TABLE", "CREATE TABLE outbox.delivered_default ();"),
            ("delivered_p20240229", "TABLE", "CREATE TABLE outbox.delivered_p20240229 ();"),
            ("attempts_p20240229_06", "TABLE", "CREATE TABLE outbox.attempts_p20240229_06 ();"),
            (
                "delivered_p20240229_completed_at_idx",
                "INDEX ATTACH",
                "ALTER INDEX outbox.delivered_completed_idx ATTACH PARTITION "
                "outbox.delivered_p20240229_completed_at_idx;",
            ),
            ("TABLE delivered", "ACL", "GRANT DELETE ON TABLE outbox.delivered TO run_7;"),
        )
        + "--\n-- PostgreSQL database dump complete\n--\n\n\\unrestrict abc\n",
        {"dispatcher": "run_7"},
        latest=34,
    )
    assert "_p2024" not in text
    assert "restrict" not in text and "SET lock_timeout" not in text
    assert "CREATE TABLE outbox.delivered ();" in text
    assert "CREATE TABLE outbox.delivered_default ();" in text
    assert "GRANT DELETE ON TABLE outbox.delivered TO outbox_dispatcher;" in text
    assert "run_7" not in text


def test_a_date_near_today_in_the_schema_is_refused() -> None:
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    constraint = f"ALTER TABLE outbox.delivered ADD CHECK (completed_at < '{today}');"
    with pytest.raises(RuntimeError, match=today):
        schema_file.render(dump(("delivered c", "CONSTRAINT", constraint)), {}, latest=34)
