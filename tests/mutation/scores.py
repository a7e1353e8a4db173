"""The last score of each set of mutants, kept in ``tests/mutation/scores.md``: one
row per runner and set (``sql_mutants``' sets, ``python_mutants``' modules),
rewritten by each run of that set with its date and command; the other rows stay.
"""

from __future__ import annotations

import datetime
from pathlib import Path

FILE = Path(__file__).with_name("scores.md")
_TITLE = "# Mutation scores"
_INTRO = (
    "The last run of each set of mutants, written by the runner that ran it"
    " (`python -m tests.mutation.sql_mutants`, `python -m tests.mutation.python_mutants`)."
    " Killed: a test failed on the mutant; equivalent: a mutant no test can tell apart,"
    " excused in the runner with the reason. The SQL sets run in one test process on the"
    " embedded server."
)
_HEAD = "| runner | set | score | date (UTC) | command |\n|---|---|---|---|---|"


def _rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith(("| runner ", "|---"))
    ]


def record(
    runner: str,
    name: str,
    score: str,
    command: str,
    *,
    when: datetime.datetime | None = None,
    file: Path = FILE,
) -> None:
    """Write the score of ``runner``'s set ``name`` into ``file``, in place of the
    one it had."""
    when = when or datetime.datetime.now(datetime.UTC)
    row = [runner, name, score, when.strftime("%Y-%m-%d %H:%M"), f"`{command}`"]
    rows = _rows(file.read_text("utf-8")) if file.exists() else []
    for i, old in enumerate(rows):
        if old[:2] == row[:2]:
            rows[i] = row
            break
    else:
        rows.append(row)
    _write(file, rows)


def _write(file: Path, rows: list[list[str]]) -> None:
    lines = [_TITLE, "", _INTRO, "", _HEAD, *("| " + " | ".join(r) + " |" for r in rows)]
    file.write_text("\n".join(lines) + "\n", "utf-8")
