"""``benchmarks/publish_cost.py --filters`` still runs: each costly filter is
judged in a real publish and stops at a bound of its budget (on small payloads
here, so the text and step cases must still reach theirs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "publish_cost.py"
SMALL = ["-n", "1", "--room", "8192"]  # one publish per filter, payloads of 8 KiB
# a filter's name, five figures (chars, payload, publish ms, peak MB, filter ms), steps, verdict
ROW = re.compile(r"^(\S+(?: \S+)?)\s+(?:[\d.]+\s+){6}(.+)$", re.MULTILINE)


@pytest.mark.slow
def test_publish_cost_prints_each_filters_verdict_and_peak_memory(database_url: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--filters", "--database-url", database_url, *SMALL],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = dict(ROW.findall(done.stdout))
    assert rows["typical"] == "match", done.stdout
    assert rows["to_string x12"].endswith("characters of text"), done.stdout
    assert rows["join separator"].endswith("characters of text"), done.stdout
    assert rows["flattens x4"].endswith("steps"), done.stdout
