"""The last score of each set of mutants, kept in one place: the table of
``docs/contributing/testing.md`` between :data:`BEGIN` and :data:`END`. One row per
runner and set (``sql_mutants``' sets, ``python_mutants``' modules), rewritten by
each run of the whole set with its date; the other rows stay where they are.
``tests/unit/test_mutation_runners.py`` holds the table to the runners: a row for
every set and module, each at 100% of its non-equivalent mutants.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "contributing" / "testing.md"
BEGIN = "<!-- mutation scores: written by tests/mutation/scores.py, do not edit -->"
END = "<!-- end of mutation scores -->"
_HEAD = (
    "| runner | set | mutants | killed | equivalent | non-equivalent killed | last run (UTC)"
    " | command |\n|---|---|--:|--:|--:|--:|---|---|"
)


@dataclass(frozen=True)
class Score:
    """One run of a whole set: how many mutants it made, how many a test noticed,
    how many are excused as equivalent (the rest survived, or did not apply)."""

    runner: str
    name: str
    mutants: int
    killed: int
    equivalent: int
    command: str
    """The command that runs this set alone."""
    when: str = ""
    """``YYYY-MM-DD HH:MM`` in UTC; :func:`record` fills it in."""

    @property
    def not_killed(self) -> int:
        """The mutants neither killed nor excused: each fails the run."""
        return self.mutants - self.killed - self.equivalent

    def percent(self) -> str:
        """The share of the non-equivalent mutants killed."""
        rest = self.mutants - self.equivalent
        return f"{100.0 * self.killed / rest if rest else 100.0:.1f}%"

    def summary(self) -> str:
        text = f"{self.killed}/{self.mutants} killed, {self.equivalent} equivalent"
        return f"{text}: {self.percent()} of the others" + (
            f"; {self.not_killed} not killed" if self.not_killed else ""
        )

    def row(self) -> str:
        cells = (
            self.runner, self.name, str(self.mutants), str(self.killed), str(self.equivalent),
            self.percent(), self.when, f"`{self.command}`",
        )  # fmt: skip
        return "| " + " | ".join(cells) + " |"

    @classmethod
    def parse(cls, line: str) -> Score:
        runner, name, mutants, killed, equivalent, _, when, command = (
            cell.strip() for cell in line.strip().strip("|").split("|")
        )
        return cls(
            runner, name, int(mutants), int(killed), int(equivalent), command.strip("`"), when
        )


def _block(text: str) -> tuple[int, int]:
    """Where the table's block starts and ends in the page's text (the markers
    included)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise LookupError(f"{PAGE.name} has no {BEGIN!r} ... {END!r} block")
    return start, end + len(END)


def read(page: Path = PAGE) -> list[Score]:
    """The scores in the page's table, in its order."""
    text = page.read_text("utf-8")
    start, end = _block(text)
    return [
        Score.parse(line)
        for line in text[start:end].splitlines()
        if line.startswith("| ") and not line.startswith("| runner ")
    ]


def render(rows: list[Score]) -> str:
    """The table's block, markers included, as :func:`record` writes it."""
    return "\n".join([BEGIN, "", _HEAD, *(row.row() for row in rows), "", END])


def block(page: Path = PAGE) -> str:
    """The table's block as it is in the page."""
    text = page.read_text("utf-8")
    start, end = _block(text)
    return text[start:end]


def record(score: Score, *, when: datetime.datetime | None = None, page: Path = PAGE) -> None:
    """Write ``score`` into the page's table in place of the row of its set (a new
    set's row goes last), dated ``when`` (now)."""
    when = when or datetime.datetime.now(datetime.UTC)
    dated = replace(score, when=when.strftime("%Y-%m-%d %H:%M"))
    rows = read(page)
    for i, old in enumerate(rows):
        if (old.runner, old.name) == (dated.runner, dated.name):
            rows[i] = dated
            break
    else:
        rows.append(dated)
    text = page.read_text("utf-8")
    start, end = _block(text)
    page.write_text(text[:start] + render(rows) + text[end:], "utf-8")
