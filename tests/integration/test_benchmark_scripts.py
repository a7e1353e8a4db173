"""The scripts in ``benchmarks/`` still run: tiny sizes, on the test's database.

They print figures and assert nothing about speed; these tests only keep them
from rotting as the code they drive changes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
def test_every_script_documents_its_options(script: str) -> None:
    assert "usage:" in run(script, "--help")


def test_sql_cost_prints_cpu_per_message_and_plan_cost(database_url: str) -> None:
    out = run("sql_cost.py", "--database-url", database_url, "-n", "300", "--batch", "50")
    row = re.search(r"^\s*50\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)", out, re.MULTILINE)
    assert row, out
    claim, complete, total = (float(x) for x in row.groups())
    assert total >= claim + complete > 0
    assert re.search(r"^claim_uncapped\s+\d+\s+\d+$", out, re.MULTILINE), out


def test_publish_cost_prints_a_median_per_endpoint_count(database_url: str) -> None:
    out = run(
        "publish_cost.py", "--database-url", database_url, "-n", "20", "--endpoints", "1", "3"
    )
    assert len(re.findall(r"^\s*[13]\b.*\d", out, re.MULTILINE)) == 2, out
