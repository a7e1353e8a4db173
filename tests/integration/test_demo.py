"""`outbox demo` runs end to end and checks its own invariants."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.timeout(120)
def test_demo_holds_every_invariant(database_url: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatchers.cli",
            "demo",
            "--database-url",
            database_url,
            "--events",
            "200",
            "--rate",
            "400",
            "--seed",
            "7",
        ],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert "every invariant held" in result.stdout
    lines = dict(
        (name.strip(), value.strip())
        for name, value in (
            line.rsplit("  ", 1) for line in result.stdout.splitlines() if "  " in line.strip()
        )
    )
    committed = int(lines["events committed"])
    assert 150 < committed < 200  # about a tenth rolled back on purpose
    assert int(lines["effects applied"]) == 2 * committed
    assert int(lines["duplicates suppressed by the inbox"]) > 0
    # the progress says the load is paced, so nobody reads it as throughput
    assert "published at a steady 400/s (a paced load" in result.stderr
    assert "/s, paced by the publishers" in result.stderr
