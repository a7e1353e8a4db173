"""`outbox demo` runs end to end and checks its own invariants."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.dashboard import serving


@pytest.mark.timeout(120)
@pytest.mark.slow
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


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_demo_with_ui_serves_the_dashboard_on_the_demos_data(
    database_url: str, tmp_path: Path
) -> None:
    command = ["demo", "--database-url", database_url, "--events", "50", "--rate", "400"]
    with serving([*command, "--seed", "7", "--ui", "--ui-port", "0"], tmp_path / "out") as url:
        page = _get(url)
    assert "schema <b>outbox_demo</b>" in page
    delivered = re.search(r'class="key delivered"></span> delivered (\d+)', page)
    assert delivered is not None and int(delivered[1]) > 0
    assert "every invariant held" in (tmp_path / "out").read_text()
