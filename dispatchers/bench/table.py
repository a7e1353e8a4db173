"""The bench's table: rows of figures beside their targets, and its plain-text
layout (columns padded, "met" or "MISSED" where a figure has a target)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A goal for one figure: ``at_least``, ``at_most`` or ``below`` ``value``."""

    op: str  # ">=", "<=" or "<"
    value: float
    text: str

    def met(self, figure: float | None) -> bool | None:
        if figure is None:
            return None
        if self.op == ">=":
            return figure >= self.value
        return figure <= self.value if self.op == "<=" else figure < self.value


def at_least(value: float, text: str) -> Target:
    return Target(">=", value, text)


def at_most(value: float, text: str) -> Target:
    return Target("<=", value, text)


def below(value: float, text: str) -> Target:
    return Target("<", value, text)


@dataclass(frozen=True)
class Row:
    """One line of the table; ``met`` is None where the figure has no target (or
    was not measured)."""

    scenario: str
    measure: str
    value: str
    target: str = ""
    met: bool | None = None


def number(value: float | None, spec: str = ",.0f") -> str:
    """``value`` formatted by ``spec``, or "n/a" when it was not measured."""
    return "n/a" if value is None else format(value, spec)


def numbers(values: list[float | None], spec: str) -> str:
    """Several figures in one cell, comma-separated."""
    return ", ".join(number(v, spec) for v in values)


def row(
    scenario: str, measure: str, value: float | None, spec: str, target: Target | None = None
) -> Row:
    """A row for one figure, judged against ``target`` when it has one."""
    if target is None:
        return Row(scenario, measure, number(value, spec))
    return Row(scenario, measure, number(value, spec), target.text, target.met(value))


def format_table(rows: list[Row]) -> str:
    header = Row("scenario", "measure", "value", "target", None)
    cells = [
        (
            r.scenario,
            r.measure,
            r.value,
            r.target,
            "" if r.met is None else ("met" if r.met else "MISSED"),
        )
        for r in [header, *rows]
    ]
    cells[0] = (*cells[0][:4], "")
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    lines = []
    for i, c in enumerate(cells):
        line = "  ".join(
            [
                c[0].ljust(widths[0]),
                c[1].ljust(widths[1]),
                c[2].rjust(widths[2]),
                c[3].ljust(widths[3]),
                c[4],
            ]
        )
        lines.append(line.rstrip())
        if i == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)
