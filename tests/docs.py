"""The README and the documentation site's pages, as the tests that hold them to
the code read them.

A page is named by its path under ``docs/`` (``"how-to/dispatcher.md"``); the
README by ``"README.md"``. Pure: reads files.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = "README.md"

FENCED = re.compile(r"^ *```(\w*)\n(.*?)^ *```$", flags=re.M | re.S)
"""A fenced code block: its language (maybe empty) and its text."""


def page(name: str) -> str:
    """The text of the README (``"README.md"``) or of the page ``docs/<name>``."""
    path = ROOT / README if name == README else DOCS / name
    return path.read_text(encoding="utf-8")


def pages() -> list[str]:
    """Every page of the site by its name, in order (the generated reference's
    placeholders are read as they are written)."""
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))


def all_docs_text() -> str:
    """The README and every page, one after the other."""
    return "\n\n".join(page(name) for name in [README, *pages()])


def section(name: str, heading: str) -> str:
    """The section of ``name`` under the heading ``heading`` (at any level, the
    heading line included), up to the next heading of the same level or above;
    headings inside code blocks do not count."""
    text = page(name)
    lines = text.splitlines(keepends=True)
    fence = False
    start: int | None = None
    level = 0
    for index, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        match = re.match(r"^(#{1,6}) (.*?)\s*$", line)
        if match is None:
            continue
        if start is None:
            if match.group(2) == heading:
                start, level = index, len(match.group(1))
        elif len(match.group(1)) <= level:
            return "".join(lines[start:index])
    if start is None:
        raise LookupError(f"{name} has no heading {heading!r}")
    return "".join(lines[start:])


def blocks(name: str, heading: str) -> list[tuple[str, str]]:
    """The fenced blocks of the section ``heading`` of ``name``: (language, text)."""
    return FENCED.findall(section(name, heading))


def prose(text: str) -> str:
    """``text`` with every run of whitespace made one space: a sentence matches
    whatever its line breaks."""
    return " ".join(text.split())
