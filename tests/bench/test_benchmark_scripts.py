"""The scripts in ``benchmarks/`` still run: tiny sizes, on the test's database.

They print figures and assert nothing about speed; these tests only keep them
from rotting as the code they drive changes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from outbox.migrations import load_migrations

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script: str, *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
@pytest.mark.slow
def test_every_script_documents_its_options(script: str) -> None:
    assert "usage:" in run(script, "--help")


@pytest.mark.slow
def test_sql_cost_prints_cpu_per_message_and_plan_cost(database_url: str) -> None:
    out = run("sql_cost.py", "--database-url", database_url, "-n", "300", "--batch", "50")
    row = re.search(r"^\s*50\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)", out, re.MULTILINE)
    assert row, out
    claim, complete, total = (float(x) for x in row.groups())
    assert total >= claim + complete > 0
    assert re.search(r"^claim_uncapped\s+\d+\s+\d+$", out, re.MULTILINE), out


def test_alert_triggers_cost_prints_each_statement_with_the_trigger_on_and_off(
    database_url: str,
) -> None:
    out = run("alert_triggers_cost.py", "--database-url", database_url, "-n", "40", "--rounds", "1")
    rows = re.findall(r"^(claim-like|dead, no taker|dead, one taker)(?:\s+[\d.]+){4}$", out, re.M)
    assert rows == ["claim-like", "dead, no taker", "dead, one taker"], out


@pytest.mark.slow
def test_sql_cost_against_another_schema_version_prints_a_row_for_each(database_url: str) -> None:
    # the newest version: the statements of this tree need every migration up to
    # 0006 (signing secrets in their own table), so no earlier version runs them
    version = load_migrations()[-1].version
    out = run(
        "sql_cost.py",
        "--database-url",
        database_url,
        *("-n", "60", "--batch", "20", "--against", str(version)),
    )
    rows = re.findall(rf"^\s*20(?:\s+-?[\d.]+){{5}}(\s+v{version:04d})?$", out, re.MULTILINE)
    assert rows == ["", f"  v{version:04d}"], out


@pytest.mark.slow
def test_publish_cost_prints_a_median_per_endpoint_count(database_url: str) -> None:
    out = run(
        "publish_cost.py", "--database-url", database_url, "-n", "20", "--endpoints", "1", "3"
    )
    assert len(re.findall(r"^\s*[13]\b.*\d", out, re.MULTILINE)) == 2, out


@pytest.mark.slow
def test_tenant_fanout_cost_prints_each_case_with_the_messages_it_writes(
    database_url: str,
) -> None:
    out = run(
        "tenant_fanout_cost.py",
        *("--database-url", database_url, "-n", "20", "--round", "10"),
        *("--tenants", "50", "--per-tenant", "10"),
    )
    rows = re.findall(r"^(.*publish for .*?)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+\(", out, re.MULTILINE)
    assert [int(count) for _, count in rows] == [10, 10, 10], out
    assert "500 endpoints, publish for one tenant" in out, out


@pytest.mark.skipif(shutil.which("pgbench") is None, reason="needs pgbench")
@pytest.mark.slow
def test_enqueue_floor_prints_the_floor_and_the_schema_it_is_measured_against(
    database_url: str,
) -> None:
    out = run(
        "enqueue_floor.py",
        "--database-url",
        database_url,
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--clients",
        "1",
        "--statements",
        "2",
        "--against",
        "3",
    )
    wal = {
        m[1]: int(m[2])
        for m in re.finditer(r"^(\S+)\s+\d+\s+[\d.]+\s+\d+\s+\d+\s+(\d+)$", out, re.M)
    }
    assert set(wal) == {
        "plain",
        "floor",
        "enqueue",
        "enqueue-notify",
        "enqueue-v0003",
        "enqueue-notify-v0003",
    }, out
    # two rows per transaction: each script writes more WAL than the business row alone
    assert wal["plain"] < wal["floor"] < wal["enqueue"], out


@pytest.mark.slow
def test_ui_pages_fills_the_schema_and_times_every_page(database_url: str) -> None:
    out = run(
        "ui_pages.py",
        "--database-url",
        database_url,
        *("--hot", "5000", "--history", "5000", "--repeat", "1"),  # page /messages/4242 exists
    )
    timed = re.findall(r"^(/\S*)\s+median\s+[\d.]+ ms\s+max\s+[\d.]+ ms$", out, re.MULTILINE)
    assert "/" in timed and "/endpoints" in timed and len(timed) >= 10, out


@pytest.mark.slow
def test_ordering_cost_prints_a_row_per_variant(database_url: str) -> None:
    out = run("ordering_cost.py", "--database-url", database_url, "-n", "20", "--rounds", "1")
    for variant in ("no key", "a key", "two producers, two keys", "two producers, one key"):
        assert re.search(rf"^{variant}\s+\d+\s+\d+\s+\d+$", out, re.MULTILINE), out


@pytest.mark.slow
def test_many_databases_prints_both_rates_and_the_small_databases_wait(database_url: str) -> None:
    out = run(
        "many_databases.py",
        *("--database-url", database_url, "-n", "50", "--rounds", "1"),
        *("--backlog", "60", "--small", "5", "--delay", "0.01"),
    )
    assert re.search(r"^one database\s+\d+ messages/s$", out, re.MULTILINE), out
    assert re.search(r"^two databases, one process\s+\d+ messages/s", out, re.MULTILINE), out
    assert re.search(r"the small database's 5 drained in [\d.]+ s", out), out


@pytest.mark.slow
def test_history_scale_prints_the_removal_of_a_day_and_the_throughputs(
    database_url: str,
) -> None:
    out = run(
        "history_scale.py",
        *("--database-url", database_url, "--rows", "3000", "--days", "3"),
        *("--messages", "200", "--enqueues", "100", "--rounds", "2"),
    )
    removal = re.findall(r"^\s*(\S.*?)\s+(\d+\.\d{3})\s+(\d+\.\d{2})$", out, re.MULTILINE)
    assert [name.strip() for name, *_ in removal] == [
        "DELETE the day, unpartitioned, 5,000 a batch",
        "and the VACUUM it leaves",
        "the day's keys, DELETE, 5,000 a batch",
        "drop the day's two partitions",
        "turn: every key made previous",
        # the keys of the two days left, in the previous generation
        "turn: 2,000 keys dropped whole",
    ], out
    assert "1,000 delivered rows" in out, out
    throughput = re.findall(r"^(empty|large) history\s+\d+\s+\d+$", out, re.MULTILINE)
    assert throughput == ["empty", "large", "empty", "large"], out
